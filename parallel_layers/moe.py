"""A mixture of experts' MLP with expert parallelism (Megatron-Core's MoE layer, as cost_models/moe.py plans it).

Each token's MLP input goes through a linear router (replicated, E logits), its top-k experts are chosen on the
logits and weighted by a softmax over those k (Mixtral's and Qwen3-MoE's normalised top-k; Megatron-Core's default
``--moe-router-pre-softmax`` off).  The expert-parallel group (``ep`` ranks of a stage's tp x cp x dp ranks,
consecutive with tp innermost: Megatron's parallel folding with expert tensor parallelism 1) holds the E experts,
E / ep whole SwiGLU MLPs a rank.  A rank permutes its own tokens by expert (under sequence parallelism its sequence
shard: the MoE layer takes no tensor-parallel collective), sends each expert's tokens and their k probabilities to
the rank holding it (``all_to_all_single``: the dispatch), runs its experts one GEMM each (each expert's tokens
contiguous), applies the probabilities inside the SwiGLU (Megatron-Core's weighted SwiGLU, so no expert output is
kept for the probabilities' gradient), sends the results back (the combine) and sums each token's k of them.

Saved for the backward, a token (cost_models.moe.saved_bytes_per_token): its k dispatched copies (k x h, the
experts' GEMM input), the experts' gate and up outputs (2 k x ffn) and the weighted activation (k x ffn, the down
GEMM's input), the k probabilities (fp32), the router's E softmax scores (fp32, the auxiliary loss's) and the
permutation's indices; with training.moe_recompute act or norm-act (Megatron-LM's --recompute-modules moe_act) not
the weighted activation, which the backward rebuilds from gate, up and the probabilities (MoEMLP.act_recompute;
model.Block rebuilds the norm's output too under norm-act).  Expert weights' gradients are summed over the ranks
holding the same experts (the expert data-parallel group, tp x cp x dp / ep ranks) and divided as the dense ones are
(train.reduce_expert_gradients).

The auxiliary load-balancing loss (Switch Transformer's, Megatron-Core's ``--moe-router-load-balancing-type aux_loss``
with ``--moe-aux-loss-coeff``): coeff x E / (k T^2) x sum_e P_e N_e over the micro-batch's T tokens, P_e the
router's summed softmax score of expert e and N_e the tokens sent to it, counted over the whole sequence (the counts
summed over tp and cp, as Megatron-Core sums them over its tp x cp group).  It is not added to the reported loss:
its gradient enters the router's backward directly (Megatron-Core's MoEAuxLossAutoScaler), at the scale the
language-model loss's backward starts from (``MoEState.grad_scale``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from parallel_layers.layers import ShardSpec, _autocast_input, _ShardedModule
from parallel_layers.mappings import _size
from parallel_layers.rebuild import RebuiltForBackward

INIT_STD = 0.02
# the auxiliary loss's default coefficient: the one `parplan export --to megatron` writes (--moe-aux-loss-coeff 0.01,
# Megatron-LM's Mixtral example's)
AUX_LOSS_COEFF = 0.01


@dataclass
class MoEState:
    """What every MoE layer of a rank shares: the auxiliary loss's coefficient, the scale its gradient enters the
    backward at (set by the runtime before each step: 1 / micro-batches where the loss is divided before its
    backward, times the fp16 loss scale, times cp, whose replicas' gradients are averaged where the loss's partial
    sums must add), whether routing is forced balanced, and the step's tokens per expert of each layer (for the
    report)."""
    aux_loss_coeff: float = 0.0
    grad_scale: float = 1.0
    # benchmarks: token copy j of a rank's token t goes to expert (t k + j) mod E, every expert the same share (the
    # balanced routing the cost model assumes; Megatron-LM's --moe-router-force-load-balancing, for its performance
    # runs, draws random logits instead: balanced on average).  The router still runs and is trained through the
    # chosen logits.
    balanced: bool = False
    # the step's tokens per expert of each layer on this rank (its own tokens, every micro-batch; a recompute counts
    # them again, which leaves the shares as they were): load_imbalance reads them, begin_step clears them
    counts: dict = field(default_factory=dict)

    def begin_step(self) -> None:
        self.counts.clear()

    def load_imbalance(self) -> Optional[float]:
        """The median over layers of the busiest expert's tokens over the mean expert's (1.0: every expert its share,
        as the cost model assumes) in this rank's step so far; None before any MoE forward."""
        if not self.counts:
            return None
        ratios = sorted(float(c.max() / c.float().mean()) for c in self.counts.values() if c.sum() > 0)
        return ratios[len(ratios) // 2] if ratios else None


class _AllToAll(torch.autograd.Function):
    """Rows of x sent to the group's ranks in in_splits order, out_splits rows received; the backward sends the
    gradients back the same way."""

    @staticmethod
    def forward(ctx, x, group, out_splits, in_splits):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        return _all_to_all(x, group, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.in_splits, ctx.out_splits), None, None, None


def _all_to_all(x, group, out_splits, in_splits):
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def _weighted_swiglu(gate, up, p):
    """silu(gate) * up * p, p a (rows,) fp32 probability (the forward of _WeightedSwiGLU, and its rebuild where the
    experts' activation is recomputed: the same ops, the same values)."""
    return F.silu(gate) * up * p.unsqueeze(-1).to(gate.dtype)


class _WeightedSwiGLU(torch.autograd.Function):
    """silu(gate) * up * p, p a (rows,) fp32 probability: saves gate, up and p (not the product)."""

    @staticmethod
    def forward(ctx, gate, up, p):
        ctx.save_for_backward(gate, up, p)
        return _weighted_swiglu(gate, up, p)

    @staticmethod
    def backward(ctx, grad):
        """In the inputs' dtype, as model._SwiGLU's (the probabilities' gradient too), in place where it can: at most
        three tensors of the rows' width live beside the inputs and grad (sig, silu and one product), as the unweighted
        SwiGLU's backward holds."""
        gate, up, p = ctx.saved_tensors
        pw = p.unsqueeze(-1).to(gate.dtype)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        d_p = (grad * up).mul_(silu).sum(-1)  # (an fp32 sum would first copy the product to fp32)
        d_up = (grad * silu).mul_(pw)
        del silu
        d_gate = torch.sub(1, sig).mul_(gate).add_(1).mul_(sig)  # silu'(gate) = sig (1 + gate (1 - sig))
        del sig
        d_gate.mul_(grad).mul_(up).mul_(pw)
        return d_gate, d_up, d_p.to(p.dtype)


class _GroupedLinear(torch.autograd.Function):
    """Each local expert's rows times its weight: x (N, in) in expert order split by counts, weight (E_l, out, in)
    -> (N, out), one GEMM an expert (a grouped GEMM's work).  The backward writes every expert's dW into one
    (E_l, out, in) gradient, as a grouped GEMM does: F.linear on weight[e] expert by expert made each expert's
    gradient a zero-filled tensor of the whole stack (select's backward), one more of it at a time (the fp32 recipe's
    wide plans read -8.3 % against the allocator with it, 2026-12-05).  Under autocast the weight's 16-bit cast is kept
    for the backward, as F.linear's own backward (and layers._TPLinears) keeps it."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, counts):
        x, w = _autocast_input(x), _autocast_input(weight)
        ctx.save_for_backward(x, w)
        ctx.counts = counts
        out = x.new_empty((x.shape[0], w.shape[1]))
        for e, (rows, o) in enumerate(zip(x.split(counts), out.split(counts))):
            torch.mm(rows, w[e].t(), out=o)  # into place: no per-expert pieces to concatenate
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        grads, rows = grad.split(ctx.counts), x.split(ctx.counts)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = grad.new_empty(x.shape)
            for e, (g, d) in enumerate(zip(grads, dx.split(ctx.counts))):
                torch.mm(g, w[e], out=d)
        if ctx.needs_input_grad[1]:
            dw = torch.empty_like(w)
            for e, (g, r) in enumerate(zip(grads, rows)):
                torch.mm(g.t(), r, out=dw[e])  # an expert with no rows: zeros
        return dx, dw, None


class _AuxLossScaler(torch.autograd.Function):
    """Identity on x; its backward also starts aux's backward with `scale` (Megatron-Core's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, x, aux, state):
        ctx.state = state
        ctx.save_for_backward(aux)
        return x

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.state.grad_scale), None


def _sum_over(t: torch.Tensor, *groups) -> torch.Tensor:
    for g in groups:
        if _size(g) > 1:
            dist.all_reduce(t, group=g)
    return t


class MoEMLP(_ShardedModule):
    """The MoE block's MLP (see the module docstring): router (E, h) replicated over tp (a sequence shard's partial
    gradient under SP, summed over tp as a norm's), experts gate / up (E, f, h) and down (E, h, f) split over the
    expert-parallel group by their first dimension, E / ep a rank (held by a GroupedExperts module of their own)."""

    def __init__(self, cfg, i: int, tp_group, sp: bool, ep_group, *, cp_group=None, state: Optional[MoEState] = None,
                 selective: bool = False, act_recompute: bool = False):
        super().__init__(tp_group)
        h, E, k = cfg.hidden, cfg.experts, cfg.experts_per_token
        self.ep_group, self.ep_size = ep_group, _size(ep_group)
        self.ep_rank = 0 if self.ep_size == 1 else dist.get_rank(ep_group)
        if E % self.ep_size:
            raise ValueError(f"{E} experts do not split over ep={self.ep_size}")
        if self.tp_size > 1 and not sp:
            raise ValueError("a mixture of experts under tensor parallelism needs sequence parallelism (each rank "
                             "routes its sequence shard)")
        self.experts, self.top_k, self.local, self.layer = E, k, E // self.ep_size, i
        self.cp_group, self.state = cp_group, state or MoEState()
        # selective recompute: the weighted SwiGLU re-run in the backward, as the dense MLP's activation (model.MLP)
        self.selective = selective
        # training.moe_recompute act / norm-act (Megatron-LM's --recompute-modules moe_act): the activation's output,
        # the down GEMM's saved input, rebuilt for its backward from the kept gate, up and probabilities (_run_experts;
        # model.Block sets it, never on the blocks model.StageModule checkpoints whole)
        self.act_recompute = act_recompute
        n = f"layers.{i}.mlp"
        partial = sp and self.tp_size > 1
        self._new_param("router", ShardSpec(f"{n}.router.weight", (E, h), None, "normal", sp_partial_grad=partial))
        # the rank's experts, a module of their own: under ZeRO-3 FSDP2 shards them over their expert-data-parallel
        # group apart from the block's other weights (data_parallel.apply_fsdp, torchtitan's MoE layout)
        self.grouped = GroupedExperts(cfg, n, tp_group, self.ep_size, self.ep_rank)

    # the experts' weights, (E / ep, f, h) and (E / ep, h, f): the GroupedExperts module's
    gate = property(lambda self: self.grouped.gate)
    up = property(lambda self: self.grouped.up)
    down = property(lambda self: self.grouped.down)

    def forward(self, x):  # (b, s_local, h) -> (b, s_local, h)
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = F.linear(tokens, self.router).float()  # (T, E)
        if self.state.balanced:
            n = tokens.shape[0] * self.top_k
            idx = (torch.arange(n, device=logits.device) % self.experts).view(-1, self.top_k)
        else:
            idx = torch.topk(logits.detach(), self.top_k, dim=-1).indices  # (T, k)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the token copies, expert by expert
        counts = torch.bincount(flat, minlength=self.experts)
        seen = self.state.counts.get(self.layer)
        self.state.counts[self.layer] = counts.detach() if seen is None else seen + counts.detach()
        if self.training and self.state.aux_loss_coeff > 0 and torch.is_grad_enabled():
            logits = _AuxLossScaler.apply(logits, self._aux_loss(logits, counts), self.state)
        probs = torch.softmax(logits.gather(-1, idx), dim=-1)  # (T, k): the chosen experts' weights
        source = order // self.top_k
        dispatched = tokens[source]  # (T k, h)
        weights = probs.reshape(-1)[order]
        y = self._experts_of_group(dispatched, weights, counts)
        # each token's k results summed, gathered back into token order (index_add would save y for its backward)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        out = y[inverse].view(-1, self.top_k, y.shape[-1]).sum(1)
        return out.reshape(shape).to(x.dtype)

    def _aux_loss(self, logits, counts):
        scores = torch.softmax(logits, dim=-1)  # (T, E) fp32, over every expert
        global_counts = _sum_over(counts.detach().clone(), self.tp_group, self.cp_group).to(scores.dtype)
        total = scores.shape[0] * self.tp_size * _size(self.cp_group)
        coeff = self.state.aux_loss_coeff * self.experts / (self.top_k * total * total)
        return (scores.sum(0) * global_counts).sum() * coeff

    def _experts_of_group(self, dispatched, weights, counts):
        """The dispatch over the expert-parallel group, the rank's experts, the combine: rows in and out in the
        rank's expert order."""
        if self.ep_size == 1:
            return self._run_experts(dispatched, weights, counts.tolist())
        E_l = self.local
        send = counts.view(self.ep_size, E_l)
        recv = _all_to_all(send.contiguous(), self.ep_group, [1] * self.ep_size, [1] * self.ep_size)  # [src, e]
        in_splits, out_splits = send.sum(1).tolist(), recv.sum(1).tolist()
        got = _AllToAll.apply(dispatched, self.ep_group, out_splits, in_splits)  # [src][e] rows
        got_w = _AllToAll.apply(weights, self.ep_group, out_splits, in_splits)
        # rows grouped by source then expert -> by expert then source
        block = torch.repeat_interleave(torch.arange(self.ep_size * E_l, device=recv.device), recv.reshape(-1))
        regroup = torch.argsort((block % E_l) * self.ep_size + block // E_l, stable=True)
        y = self._run_experts(got[regroup], got_w[regroup], recv.sum(0).tolist())
        y = y[torch.argsort(regroup)]  # back to [src][e]
        return _AllToAll.apply(y, self.ep_group, in_splits, out_splits)

    def _run_experts(self, x, w, counts: list[int]):
        """The rank's experts on their rows (GroupedExperts.forward: called through the module, so FSDP2 gathers
        their weights first where it shards them)."""
        return self.grouped(x, w, counts, selective=self.selective, act_recompute=self.act_recompute)


class GroupedExperts(_ShardedModule):
    """A rank's E / ep experts: gate / up (E / ep, f, h) and down (E / ep, h, f), each expert a whole SwiGLU MLP
    (ShardSpec.ep_dim 0: the logical (E, ...) tensors split over the expert-parallel group by their first dimension).
    A module of their own so that ZeRO-3 can shard them over the ranks holding the same experts (torchtitan's
    ``fully_shard(transformer_block.moe.experts, mesh=edp_mesh)``), not over dp with the block's other weights."""

    def __init__(self, cfg, n: str, tp_group, ep_size: int, ep_rank: int):
        super().__init__(tp_group)
        h, f, E = cfg.hidden, cfg.ffn_hidden, cfg.experts
        self.ep_size, self.ep_rank = ep_size, ep_rank
        out_std = INIT_STD / math.sqrt(2 * cfg.layers)
        for name, shape, std in (("gate", (E, f, h), INIT_STD), ("up", (E, f, h), INIT_STD),
                                 ("down", (E, h, f), out_std)):
            self._new_param(name, ShardSpec(f"{n}.experts.{name}", shape, None, "normal", std=std, ep_dim=0))

    def forward(self, x, w, counts: list[int], selective: bool = False, act_recompute: bool = False):
        """The rank's experts on their rows (x in expert order, counts rows each), each row's probability w applied
        inside the SwiGLU.  With act_recompute the down GEMM does not keep its input, the activation's output (k x ffn
        a routed token), to its backward: RebuiltForBackward saves a handle in its place and the backward rebuilds it
        from gate, up and w, which the activation's own backward keeps anyway (cost_models.moe.recomputed_bytes)."""
        gate, up = _GroupedLinear.apply(x, self.gate, counts), _GroupedLinear.apply(x, self.up, counts)
        act = (checkpoint(_WeightedSwiGLU.apply, gate, up, w, use_reentrant=False) if selective
               else _WeightedSwiGLU.apply(gate, up, w))
        if not (act_recompute and torch.is_grad_enabled()):
            return _GroupedLinear.apply(act, self.down, counts)
        with RebuiltForBackward([act], lambda: (_weighted_swiglu(gate, up, w),), act.device.type).hooks():
            return _GroupedLinear.apply(act, self.down, counts)
