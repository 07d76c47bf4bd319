"""The torchrun entry: build a plan's layout, train N steps, write a measured-vs-predicted report.

    torchrun --nproc-per-node 8 -m parallel_layers.train --plan plan.json --steps 20 --report out.json

Order of construction (each step its own function): process group -> mesh (dp, pp, [cp,] tp) ->
stage modules holding this rank's virtual stages -> logical-seeded init -> data parallel
wrapping (FSDP2 for ZeRO-3) -> optimizer -> pipeline schedule (pp > 1) -> optional resume.

One step: micro-batches forward/backward (the pipeline schedule, or gradient accumulation
when pp = 1) -> tied-embedding and sequence-parallel gradient sums -> dp reduction -> (fp16: unscale,
skip the rest of a step whose gradients overflowed on any rank) -> clipping -> AdamW.

Context parallelism (cp > 1, ``context_parallel``): every rank of a cp group reads its
replica's samples and keeps its two load-balanced chunks of each sequence; its loss is the
mean over its tokens, so the cp-mean is the one-rank loss, and gradients are averaged over
dp x cp: one all-reduce over the flattened dp x cp group (ZeRO-0); ZeRO-1/2 and FSDP2 shard
over dp only (as the cost model's memory assumes) after an all-reduce mean over cp (before
the dp reduction for ZeRO-1/2, of the dp-reduced shards for FSDP2).

Precision (``training.precision``): amp = fp32 parameters under autocast (cuda; fp32 on CPU);
master-weights[-half-grads] = 16-bit parameters (on CPU too) with fp32 masters stepped by
``precision.MasterAdamW`` (FSDP2: ``MixedPrecisionPolicy`` over fp32 shards).  dtype fp16 scales
the loss dynamically (``loss_scale``: torch's GradScaler rule, one overflow flag for all ranks).  Offload
(``parallel.offload == "optimizer"``): the AdamW states and fp32 copies on the host, step on
the CPU (ZeRO 0-2: ``MasterAdamW``; FSDP2: ``CPUOffloadPolicy``, which keeps the sharded
parameters and gradients on the host too and steps AdamW there, the same math).
Rank 0 prints one ``[parplan] step ...`` line per step (parsed by ``planner.launch``); any rank
that fails prints ``[parplan] rank R failed: ...`` before re-raising.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import resource
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist

from cost_models.compute import (plan_fuses_wgrad, plan_overlaps_grad_reduce, plan_overlaps_param_gather,
                                  torch_weight_pass_plan)
from cost_models.layout import stages_of_rank
from parallel_layers import checkpoint as ckpt
from parallel_layers import fp8
from parallel_layers import step_profile
from parallel_layers.clip import clip_grad_norm
from parallel_layers.context_parallel import shard_sequence
from parallel_layers.cpu_matmul import fp32_matmuls
from parallel_layers.data import TokenSource, replica_sample_indices
from parallel_layers.host_memory import CpuMemoryTrace, trace_if
from parallel_layers.host_speed import dispatch_probe
from parallel_layers.dropout import MEGATRON_DROPOUT, DropoutState
from parallel_layers.telemetry import FIELDS as TELEMETRY_FIELDS, GpuTelemetry, per_step
from parallel_layers.data_parallel import (
    GradReduction,
    ShardedAdamW,
    all_reduce_bucketed,
    bucket_all_reduce_start,
    apply_fsdp,
    fsdp_grad_correction,
    local_tensor,
    sync_tp_partial_grads,
    sync_tied_embedding_grads,
)
from parallel_layers.layers import fused_vocab_parallel_cross_entropy, use_fp8_linears, vocab_parallel_cross_entropy
from parallel_layers.loss_scale import INIT_SCALE, DynamicLossScaler, wants_loss_scaling
from parallel_layers.mesh import (ParallelDims, RankCoords, build_mesh, embedding_group, expert_data_parallel_mesh,
                                  expert_groups, fsdp_mesh)
from parallel_layers.model import ModelConfig, StageModule, init_parameters, iter_shard_specs
from parallel_layers.outside_graphs import compile_module
from parallel_layers.moe import AUX_LOSS_COEFF as MOE_AUX_LOSS_COEFF, MoEState
from parallel_layers.pipeline import build_schedule, virtual_stage_layers
from parallel_layers.precision import (
    WGRAD_FUSION_MODES,
    MasterAdamW,
    attach_main_grads,
    clear_grads,
    cpu_math,
    fold_pending_grads,
    fsdp_mixed_precision,
    grad_of,
    param_dtype,
    uses_master_weights,
    wgrad_fusion_kernel,
)

LOG_PREFIX = "[parplan]"
ZERO_BUBBLE = ("interleaved-zb", "zbv")
from planner import ADAMW_BETAS, ADAMW_WEIGHT_DECAY  # noqa: E402  (the exports configure the same AdamW)
from planner.topology import host_info  # noqa: E402


@dataclass
class RunOptions:
    steps: int
    device: str = "cpu"
    data: Optional[str] = None
    data_dtype: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0
    resume: bool = False
    resume_step: Optional[int] = None  # resume from the checkpoint written after this step (default: the newest)
    warmup_steps: Optional[int] = None
    dump_grads: Optional[str] = None  # directory: per-rank reduced gradients after the first step
    optimizer: str = "adamw"  # "sgd" only for tests that need a scale-sensitive update
    debug_grad_scale: float = 1.0  # test hook: multiply reduced gradients (a deliberately wrong run)
    compile: bool = False  # torch.compile each transformer block (fuses norms, rotary, SwiGLU; GPU default)
    # nvidia-smi's SM clock, power and temperature per step on rank 0 (parallel_layers.telemetry); None: on cuda
    telemetry: Optional[bool] = None
    # master-weights: the linears' weight-gradient GEMMs add into the fp32 main_grad (precision.wgrad_fusion_kernel):
    # "auto" where the CUDA kernel runs right, "off", or "reference" (its arithmetic on any device, for tests)
    wgrad_fusion: str = "auto"
    # ZeRO 0-2: start the data-parallel reduction of each bucket of gradients during the step's last backward
    # (data_parallel.GradReduction); off: all of it after the backward.  Not under torch's own zero-bubble weight
    # pass (grad_overlap), as the cost model has it (cost_models.compute.plan_overlaps_grad_reduce)
    overlap_grad_reduce: bool = True
    # test hook: the reduction's bucket size in bytes (None: data_parallel.BUCKET_BYTES), so that a tiny model's
    # gradients span several buckets started at different points of the backward
    grad_bucket_bytes: Optional[int] = None
    # ZeRO-1/2: broadcast the stepped parameters asynchronously and wait for each part's before the next forward
    # uses them (data_parallel.ShardedAdamW.wait_for); off: each broadcast waited for after the step
    overlap_param_gather: bool = True
    memory_snapshot: Optional[str] = None  # directory: CUDA allocator history of the run, one pickle per rank
    # fp16 plans: the dynamic loss scale's starting value (parallel_layers.loss_scale; None: torch's GradScaler's 2**16)
    initial_loss_scale: Optional[float] = None
    debug_overflow_step: Optional[int] = None  # test hook: the last rank's gradients read inf at this step
    # plans with training.dropout: the rates of the hidden (embedding, residual branches) and attention dropout
    # (parallel_layers.dropout; Megatron-LM's --hidden-dropout and --attention-dropout, 0.1 each by default)
    hidden_dropout: float = MEGATRON_DROPOUT
    attention_dropout: float = MEGATRON_DROPOUT
    # test hook: the hidden-dropout masks' blocks of tokens (parallel_layers.dropout.token_blocks), fixed so that runs
    # splitting the sequence differently (SP, cp) draw the same masks
    dropout_block_tokens: Optional[int] = None
    # the hidden-dropout masks (parallel_layers.dropout.DropoutState.masks): "auto" hashes them in a run that compiles
    # its blocks (inside their graphs: no graph break) and draws them from the keyed generator in one that does not
    dropout_masks: str = "auto"
    # a mixture of experts' auxiliary load-balancing loss coefficient (parallel_layers.moe; Megatron-LM's
    # --moe-aux-loss-coeff, the 0.01 `parplan export --to megatron` writes); 0: none
    moe_aux_loss_coeff: float = MOE_AUX_LOSS_COEFF
    # benchmarks: every expert the same share of the tokens (parallel_layers.moe.MoEState.balanced), as predicted
    moe_balanced_routing: bool = False
    # directory: one step more than `steps` under torch.profiler, each rank's operator tables and trace written there
    # (parallel_layers.step_profile); that step is in no reported step time
    profile: Optional[str] = None


@dataclass
class Runtime:
    plan: object
    cfg: ModelConfig
    coords: RankCoords
    device: torch.device
    stage_ids: list[int]
    stage_modules: list[StageModule]
    optimizer: object
    schedule: object = None
    fsdp_correction: float = 1.0
    holds_first: bool = False
    holds_last: bool = False
    local_params: int = 0
    extra: dict = field(default_factory=dict)


def autocast_dtype(plan, device_type: str) -> Optional[torch.dtype]:
    """The forward compute dtype of the plan's precision recipe on this device."""
    recipe, dtype = plan.training.precision, plan.training.dtype
    if uses_master_weights(plan):
        return None  # the parameters themselves are 16-bit (or FSDP2 casts them): no autocast
    if recipe == "fp32" or device_type == "cpu" or dtype == "fp32":
        return None  # CPU always computes in fp32
    return torch.float16 if dtype == "fp16" else torch.bfloat16  # fp16: with dynamic loss scaling (loss_scale)


def build_runtime(plan, opts: RunOptions, device: torch.device) -> Runtime:
    par = plan.parallel
    dims = ParallelDims.from_plan(plan)
    mesh = build_mesh(dims, device.type)
    coords = RankCoords.from_mesh(mesh)
    cfg = ModelConfig.from_plan(plan)
    vstages = virtual_stage_layers(cfg.layers, par.pp, par.vpp, par.stage_layers)
    n_stages = par.pp * par.vpp
    stage_ids = stages_of_rank(coords.pp_rank, par.pp, par.vpp, par.schedule)
    if par.pp == 1:  # no pipeline: one module holding every virtual stage in order
        stage_ids = [0]
        vstages = [sum(vstages, [])]
        n_stages = 1
    ac = autocast_dtype(plan, device.type)
    if cfg.kv_lora_rank:  # multi-head latent attention (parallel_layers.model.MLAttention)
        mla_runtime_problem(plan)
    ep_group = edp_group = moe_state = None
    if cfg.experts:  # a mixture of experts (parallel_layers.moe): its expert-parallel and expert-data-parallel groups
        moe_runtime_problem(plan, opts)
        ep_group, edp_group = expert_groups(mesh, par.ep)
        moe_state = MoEState(aux_loss_coeff=opts.moe_aux_loss_coeff, balanced=opts.moe_balanced_routing)
    modules = []
    for sid in stage_ids:
        m = StageModule(cfg, vstages[sid], first=sid == 0, last=sid == n_stages - 1, tp_group=coords.tp_group,
                        sp=par.sp, recompute=par.recompute, autocast_dtype=ac, device_type=device.type,
                        cp_group=coords.cp_group, recompute_layers=par.recompute_layers, ep_group=ep_group,
                        moe_state=moe_state, mla_recompute=bool(cfg.kv_lora_rank and plan.training.mla_recompute),
                        moe_recompute=plan.training.moe_recompute if cfg.experts else "none")
        init_parameters(m, plan.training.seed)
        if plan.training.fp8:  # the blocks' linears (not the output layer's): parallel_layers.fp8
            fp8.cast_mode()  # a misspelt PARPLAN_FP8_CAST: one error before anything runs
            use_fp8_linears(m.blocks)
        # master-weights: 16-bit parameters (rounded from the fp32 init, as Megatron's master
        # copies are made from the 16-bit model); FSDP2 keeps fp32 shards and casts instead
        m = m.to(device, dtype=param_dtype(plan) if par.zero_stage != 3 else torch.float32)
        if opts.compile and not cfg.experts:  # an MoE block's token counts are data-dependent shapes: eager
            # per-block compile, before FSDP wrapping (torchtitan's order): blocks share code, so
            # one compilation serves them all; parameters stay the module's own
            for block in m.blocks:
                compile_module(block)
        modules.append(m)
    local_params = sum(p.numel() for m in modules for _, p, _ in iter_shard_specs(m))
    rt = Runtime(plan=plan, cfg=cfg, coords=coords, device=device, stage_ids=stage_ids, stage_modules=modules,
                 optimizer=None, holds_first=0 in stage_ids, holds_last=(n_stages - 1) in stage_ids,
                 local_params=local_params)
    rt.extra["mesh"] = mesh
    if cfg.experts:
        rt.extra.update(ep_group=ep_group, edp_group=edp_group, moe_state=moe_state,
                        expert_params=[p for m in modules for _, p, spec in iter_shard_specs(m) if spec.ep_dim is not None])
    # the step's own bookkeeping (its time, the loss) over a communicator of its own: on the world group it would
    # queue behind ZeRO-1/2's parameter gathers, which go on into the next step (a dp group of every rank is the
    # world group itself), and the host would wait for them between steps
    rt.extra["stats_group"] = dist.new_group()
    # a tied embedding's two copies sum their gradients over the pipeline ends (both on pp rank 0 under ZB-V)
    rt.extra["embedding_group"] = (embedding_group(mesh) if cfg.tied_embeddings and par.pp > 1
                                   and par.schedule != "zbv" else None)
    if par.zero_stage == 3:
        rt.fsdp_correction = fsdp_grad_correction(mesh["dp"], device, fsdp_mesh(mesh))
        # a mixture of experts: the experts sharded over their expert-data-parallel group, torchtitan's layout
        # (data_parallel.shard_experts)
        emesh = expert_data_parallel_mesh(mesh, par.ep, par.dp_replicate) if cfg.experts else None
        # torch 2.13: with per-block FSDP units the zero-bubble schedules (split dI/dW backward)
        # lose some blocks' gradients (caught by the layout-equivalence test); there each
        # stage is one FSDP unit.
        apply_fsdp(modules, fsdp_mesh(mesh), per_block=par.schedule not in ZERO_BUBBLE or par.pp == 1,
                   mp_policy=fsdp_mixed_precision(plan), offload_policy=_fsdp_offload(plan, device),
                   reshard_after_forward=par.pp == 1, expert_mesh=emesh)
        # the rank's shards: the report's params_per_rank had counted each rank's whole stages under ZeRO-3
        rt.local_params = sum(local_tensor(p).numel() for m in modules for _, p, _ in iter_shard_specs(m))
        if cfg.experts:  # fully_shard replaced the parameters with sharded ones
            rt.extra["expert_params"] = [p for m in modules for _, p, spec in iter_shard_specs(m)
                                         if spec.ep_dim is not None]
    elif plan.training.precision == "master-weights":
        kernel = wgrad_fusion_kernel(device, wgrad_fusion_mode(plan, opts), param_dtype(plan))
        # fp32 gradient accumulation buffers; whether any weight's GEMM adds into them (16-bit parameters only)
        rt.extra["wgrad_fusion"] = attach_main_grads(_unique_params(modules), kernel)
    rt.optimizer = build_optimizer(rt, opts)
    if isinstance(rt.optimizer, ShardedAdamW) and rt.optimizer.overlap_gather:
        for m in modules:
            m.param_wait = rt.optimizer.wait_for
    rt.extra["grad_reduction"] = build_grad_reduction(rt, opts)
    rt.extra["expert_grad_reduction"] = build_expert_grad_reduction(rt, opts)
    rt.extra["dropout"] = drop = dropout_state(plan, coords, opts, device)
    for m in modules:
        m.set_dropout(drop)
    # fp16: the loss is multiplied by the scaler's S before every backward (the schedule's loss function reads it)
    rt.extra["scaler"] = (DynamicLossScaler(opts.initial_loss_scale or INIT_SCALE) if wants_loss_scaling(plan)
                          else None)
    if par.pp > 1:
        # the schedule divides p.grad by the micro-batch count at its end, unless main_grad holds the gradients
        # (forward_backward divides those) or the dp reduction divides them, having started before that end
        rt.schedule = build_schedule(plan, modules, stage_ids, coords.pp_group, device,
                                     make_loss_fn(coords.tp_group, plan.model.vocab, fused_loss(plan),
                                                  rt.extra["scaler"]),
                                     scale_grads=not main_grads(rt) and rt.extra["grad_reduction"] is None,
                                     before_forward=None if drop is None else drop.begin)
    # the logits' storage freed when their gradient is made (model.free_after_grad), unless the schedule merges the
    # micro-batches' outputs after the step (torch < 2.8 has no return_outputs=False)
    for m in modules:
        m.free_logits_after_grad = rt.schedule is None or _takes_return_outputs(type(rt.schedule))
    return rt


def dropout_state(plan, coords: RankCoords, opts: RunOptions, device=None) -> Optional[DropoutState]:
    """The rank's dropout (parallel_layers.dropout) where the plan trains with it: opts.hidden_dropout on the
    hidden states and opts.attention_dropout on the attention probabilities, keyed by the run's seed; the hidden
    masks opts.dropout_masks' ("auto": hashed in a run that compiles its blocks, keyed draws in one that does not)."""
    if not plan.training.dropout or (opts.hidden_dropout <= 0 and opts.attention_dropout <= 0):
        return None
    masks = opts.dropout_masks if opts.dropout_masks != "auto" else "hash" if opts.compile else "keyed"
    return DropoutState(p_hidden=opts.hidden_dropout, p_attention=opts.attention_dropout, seed=plan.training.seed,
                        tp_rank=coords.tp_rank, cp_rank=coords.cp_rank, sp=plan.parallel.sp and plan.parallel.tp > 1,
                        seq_len=plan.training.seq_len, cp=plan.parallel.cp, tp=plan.parallel.tp,
                        block_tokens=opts.dropout_block_tokens,
                        masks=masks, fused=opts.compile,
                        device=str(device or opts.device), hidden=plan.model.hidden)


def grad_overlap(plan, opts: RunOptions) -> bool:
    """opts.overlap_grad_reduce, off under torch's own zero-bubble weight pass: it assigns each dW to p.grad
    outside autograd's accumulation, so no hook says when a gradient is final (the queued weight pass runs the
    weight-pass hooks, precision.register_weight_pass_hook).  The cost model applies the same rule
    (cost_models.compute.grad_reduce_overlaps, plan_overlaps_grad_reduce)."""
    return opts.overlap_grad_reduce and not torch_weight_pass_plan(plan.parallel)


def late_params(rt: Runtime) -> set:
    """ZeRO-2: id() of the parameters whose gradients other sums complete after the backward, before their dp
    reduction: the tied embedding's two copies on the pipeline's ends (summed over the embedding group) and the
    TP-replicated ones each TP rank holds a part of (ShardSpec.sp_partial_grad: SP's sequence shards, the q/k norms'
    heads; summed over TP).  ZeRO-2 keeps only a piece of a gradient after its reduction, whose rows on the two
    pipeline ends differ, so those sums must come first.  ZeRO-0/1 all-reduce whole gradients, which commutes with the
    sums: none are late there."""
    out = set()
    if rt.plan.parallel.zero_stage != 2:
        return out
    for m in rt.stage_modules:
        if rt.cfg.tied_embeddings and rt.plan.parallel.pp > 1:
            if getattr(m, "first", False):
                out.add(id(m.embed.weight))
            if getattr(m, "separate_tied_head", False):
                out.add(id(m.head.weight))
        out.update(id(p) for _, p, spec in iter_shard_specs(m) if spec.sp_partial_grad)
    return out


def build_grad_reduction(rt: Runtime, opts: RunOptions) -> Optional[GradReduction]:
    """ZeRO 0-2's data-parallel reduction (data_parallel.GradReduction) where its group has more than one rank:
    ZeRO-0 all-reduces over dp x cp, ZeRO-1/2 reduce over dp (ShardedAdamW.reduce_start; the cp replicas are
    averaged after).  It divides by the group's size, and by the micro-batch count with a pipeline (the
    schedule then leaves the gradients unscaled).  None for FSDP2 and for a group of one."""
    par, coords = rt.plan.parallel, rt.coords
    if par.zero_stage == 0:
        group, start = coords.dp_cp_group, functools.partial(_dp_bucket_start, coords.dp_cp_group)
    elif par.zero_stage in (1, 2):
        group, start = coords.dp_group, rt.optimizer.reduce_start
    else:
        return None
    n = 1 if group is None else dist.get_world_size(group)
    if n == 1:
        return None
    late = late_params(rt)
    experts = {id(p) for p in rt.extra.get("expert_params", ())}  # reduced over their own group (reduce_gradients)
    params = [p for p in _unique_params(rt.stage_modules) if id(p) not in late and id(p) not in experts]
    divide = n * (rt.plan.training.num_microbatches if par.pp > 1 else 1)
    return GradReduction(params, start, divide, group, overlap=grad_overlap(rt.plan, opts), bucket_bytes=opts.grad_bucket_bytes,
                         late=[p for p in _unique_params(rt.stage_modules) if id(p) in late])


def expert_divide(rt: Runtime) -> float:
    """What a mixture of experts' summed expert gradients are divided by: the dp x cp replicas, and the micro-batches
    where the dense reduction divides by them (a pipeline with dp x cp > 1; without one the schedule or the loss did)."""
    par, nmb = rt.plan.parallel, rt.plan.training.num_microbatches
    return par.dp * par.cp * (nmb if par.pp > 1 and rt.extra.get("grad_reduction") is not None else 1)


def build_expert_grad_reduction(rt: Runtime, opts: RunOptions) -> Optional[GradReduction]:
    """A mixture of experts' expert gradients summed over their expert-data-parallel group (tp x cp x dp / ep ranks
    holding the same experts; ZeRO-1/2 split their states over it too), bucketed and started during the backward as the
    dense reduction's (data_parallel.GradReduction), where that one runs: with dp x cp = 1 the pipeline schedule scales
    the gradients after the backward, so the experts' reduction waits for it.  ZeRO-0/1 all-reduce them; ZeRO-2
    reduces each piece to its owner in the group (the experts' ShardedAdamW.reduce_start), the others dropping it, as
    the dense ZeRO-2 does over dp.  None without experts or where no other rank holds this rank's experts
    (reduce_expert_gradients then only divides)."""
    experts, group = rt.extra.get("expert_params"), rt.extra.get("edp_group")
    if not experts or group is None or rt.plan.parallel.zero_stage == 3:  # (ZeRO-3: FSDP2 reduce-scatters them)
        return None
    dense = rt.extra.get("grad_reduction")
    eopt = rt.extra.get("expert_optimizer")
    start = (eopt.reduce_start if isinstance(eopt, ShardedAdamW) and eopt.stage == 2
             else functools.partial(_dp_bucket_start, group))
    return GradReduction(experts, start, expert_divide(rt), group,
                         overlap=grad_overlap(rt.plan, opts) and dense is not None and dense.overlap,
                         bucket_bytes=opts.grad_bucket_bytes)


def _dp_bucket_start(group, params, divide):
    return bucket_all_reduce_start([grad_of(p) for p in params if grad_of(p) is not None], group, divide)


def wgrad_fusion_mode(plan, opts: RunOptions) -> str:
    """opts.wgrad_fusion, off where the runtime cannot fuse: torch's own zero-bubble weight pass (FSDP2 with a
    zero-bubble pipeline: it asks autograd for dW, which it then assigns to p.grad); the queued weight pass
    (layers.WeightGradStore) runs the fused GEMM in its closures.  The cost model applies the same rule
    (cost_models.compute.wgrad_fusion_applies, plan_fuses_wgrad)."""
    if torch_weight_pass_plan(plan.parallel):
        return "off"
    return opts.wgrad_fusion


def _unique_params(modules) -> list:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _fsdp_offload(plan, device):
    """FSDP2's optimizer offload: sharded fp32 parameters, their gradients and the AdamW states on
    the host (pinned on cuda), the step on the CPU, all-gathers copying to the device.  More
    than the plan's offload (it also moves the weight and gradient shards off the GPU), so the
    GPU holds less than predicted; the math is the same AdamW over the same fp32 shards."""
    if plan.parallel.offload != "optimizer":
        return None
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def main_grads(rt: Runtime) -> bool:
    """Whether gradients accumulate in fp32 ``main_grad`` buffers (master-weights outside FSDP2)."""
    return rt.plan.training.precision == "master-weights" and rt.plan.parallel.zero_stage != 3


def build_optimizer(rt: Runtime, opts: RunOptions):
    params = _unique_params(rt.stage_modules)
    plan = rt.plan
    lr = plan.training.lr
    offload = plan.parallel.offload == "optimizer"
    master = uses_master_weights(plan) and plan.parallel.zero_stage != 3
    if opts.optimizer == "sgd":
        if plan.parallel.zero_stage in (1, 2) or offload or master:
            raise ValueError("--optimizer sgd is only for zero_stage 0 or 3, without offload or master weights")
        return torch.optim.SGD(params, lr=lr)
    kwargs = dict(lr=lr, betas=ADAMW_BETAS, weight_decay=ADAMW_WEIGHT_DECAY)
    if rt.device.type == "cpu" or not (offload and plan.parallel.zero_stage == 3):
        # fused AdamW steps each tensor in place with no temporaries, on the GPU and on the CPU alike (torch >= 2.4);
        # the CPU's default per-tensor loop held two fp32 temporaries of the largest parameter at the step, which
        # a GPU run does not (a 4-block run's peak: 10.7 % over the model, all of it in AdamW's sqrt and div).
        # FSDP2 + offload on cuda: the shards are CPU tensors beside CUDA ones
        kwargs["fused"] = True
    make = (functools.partial(MasterAdamW, offload=offload, keep_master=master, **kwargs)
            if (offload or master) and plan.parallel.zero_stage != 3 else None)
    if plan.parallel.zero_stage in (1, 2):
        experts = rt.extra.get("expert_params")
        if experts:  # a mixture of experts' weights: their states split over their own group (expert_optimizer)
            ids = {id(p) for p in experts}
            params = [p for p in params if id(p) not in ids]
            rt.extra["expert_optimizer"] = ShardedAdamW(experts, rt.extra["edp_group"], plan.parallel.zero_stage,
                                                        make_optim=make, **kwargs)
        return ShardedAdamW(params, rt.coords.dp_group, plan.parallel.zero_stage, make_optim=make,
                            overlap_gather=opts.overlap_param_gather and plan.parallel.dp > 1, **kwargs)
    if make is not None:
        return make(params)
    return torch.optim.AdamW(params, **kwargs)


def make_loss_fn(tp_group, vocab: int | None = None, fused: bool = False,
                 scaler: Optional[DynamicLossScaler] = None) -> Callable:
    """The loss: the autograd cross-entropy over fp32 logits, or (fused: a plan predicted with flash-attn's
    cross-entropy, training.fused_cross_entropy and cross_entropy_16bit_grad) the chunked one that keeps the
    logits and their gradient in their own dtype.  scaler (fp16): the loss times its current scale S, what every
    backward starts from (forward_backward divides the losses it reports by S; a power of two, exactly)."""
    ce = fused_vocab_parallel_cross_entropy if fused else vocab_parallel_cross_entropy

    def loss_fn(logits, target):
        loss = ce(logits, target, tp_group, vocab)
        return loss if scaler is None else loss * scaler.scale
    return loss_fn


def fused_loss(plan) -> bool:
    """Whether the plan's prediction counts the 16-bit-gradient fused cross-entropy the runtime runs then."""
    return plan.training.fused_cross_entropy and plan.training.cross_entropy_16bit_grad


def forward_backward(rt: Runtime, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[float]:
    """All micro-batches of one step; returns the replica's mean loss on ranks holding the last
    stage (None elsewhere).  Gradients end up as the mean over the replica's micro-batches."""
    nmb = rt.plan.training.num_microbatches
    red = rt.extra.get("grad_reduction")
    if red is not None:
        red.begin_step()
    rt.extra.pop("forward_dispatched_at", None)
    ered = rt.extra.get("expert_grad_reduction")
    if ered is not None:
        ered.begin_step()
    state = rt.extra.get("moe_state")
    if state is not None:  # the step's expert counts afresh; the auxiliary loss's gradient starts where the loss's
        # does: x S, / micro-batches without a pipeline (its losses are divided before their backward), x cp (the cp
        # replicas' gradients are averaged)
        state.begin_step()
        state.grad_scale = rt.plan.parallel.cp * loss_scale(rt) / (1 if rt.schedule is not None else nmb)
    if rt.schedule is None:
        loss_fn = make_loss_fn(rt.coords.tp_group, rt.plan.model.vocab, fused_loss(rt.plan), rt.extra["scaler"])
        losses = []
        drop = rt.extra.get("dropout")
        for mb, (x, y) in enumerate(zip(inputs.chunk(nmb), targets.chunk(nmb))):
            if drop is not None:
                drop.begin(mb)
            loss = loss_fn(rt.stage_modules[0](x), y)
            # the host has enqueued the first micro-batch's forward: what the backward waits on in a flow shop
            rt.extra.setdefault("forward_dispatched_at", time.perf_counter())
            (loss / nmb).backward()
            losses.append(loss.detach())  # no .item() here: it would stall the host every micro-batch
        if main_grads(rt):
            fold_pending_grads(_unique_params(rt.stage_modules))
        rt.extra["dispatched_at"] = time.perf_counter()  # host done enqueueing; the loss read below waits for the GPU
        return float(torch.stack(losses).double().sum()) / nmb / loss_scale(rt)
    losses: list = []
    args = (inputs,) if rt.holds_first else ()
    # the last stage would otherwise keep every micro-batch's output (the logits) until the next step
    # to merge them into a return value nobody reads (a CPU allocator trace found them all live)
    kw = {"return_outputs": False} if _takes_return_outputs(type(rt.schedule)) else {}
    if rt.holds_last:
        rt.schedule.step(*args, target=targets, losses=losses, **kw)
    else:
        rt.schedule.step(*args, **kw)
    if main_grads(rt):  # the schedule did not scale main_grad (built with scale_grads=False); the dp reduction does
        fold_pending_grads(_unique_params(rt.stage_modules), divide=nmb if red is None else 1.0)
    rt.extra["dispatched_at"] = time.perf_counter()
    if rt.holds_last:
        return sum(float(l.detach()) for l in losses) / len(losses) / loss_scale(rt)
    return None


def loss_scale(rt: Runtime) -> float:
    """The scale S the step's losses were multiplied by (parallel_layers.loss_scale; 1 without fp16's scaler): what
    the losses it reports are divided by, before the step's end updates S."""
    return rt.extra["scaler"].scale if rt.extra["scaler"] is not None else 1.0


@functools.lru_cache(maxsize=None)
def _takes_return_outputs(schedule_type) -> bool:
    return "return_outputs" in inspect.signature(schedule_type.step).parameters  # torch >= 2.8


def reduce_gradients(rt: Runtime, opts: RunOptions) -> None:
    """Average the step's gradients over the replicas.  ZeRO 0-2: the dp reduction of every gradient but the late
    ones (late_params) started during the backward, or now (GradReduction.finish); the tied-embedding and TP-partial
    sums; the late gradients' dp reduction; then (ZeRO-1/2) the average over the cp replicas of what each rank holds.
    Sums commute with the averages, so the order changes no value.  FSDP2 reduced its shards in the backward."""
    par = rt.plan.parallel
    red = rt.extra.get("grad_reduction")
    if red is not None:
        red.finish()
    if rt.extra.get("expert_params"):
        reduce_expert_gradients(rt)
    if rt.cfg.tied_embeddings and par.pp > 1:
        sync_tied_embedding_grads(rt.stage_modules, rt.extra["embedding_group"])
    if par.tp > 1:
        sync_tp_partial_grads(rt.stage_modules, rt.coords.tp_group)
    params = _unique_params(rt.stage_modules)
    if par.zero_stage in (0, 1, 2):
        if red is not None:
            red.reduce_now(red.late)
        if par.zero_stage in (1, 2):  # ZeRO-1/2 shard over dp: the cp replicas are averaged apart (not an expert's
            # gradient, reduced over its cp ranks too and so the same on them: reduce_expert_gradients)
            experts = {id(p) for p in rt.extra.get("expert_params", ())}
            all_reduce_bucketed([g for p, g in _held_param_grads(rt) if id(p) not in experts], rt.coords.cp_group,
                                average=True)
    else:
        # (a mixture of experts' expert weights: summed by their own unit over their group, cp ranks included, and
        # divided by reduce_expert_gradients above)
        experts = {id(p) for p in rt.extra.get("expert_params", ())}
        params = [p for p in params if id(p) not in experts]
        if rt.fsdp_correction != 1.0:
            for p in params:
                if p.grad is not None:
                    local_tensor(p.grad).div_(rt.fsdp_correction)
        # FSDP2 shards over dp; the cp replicas of each dp shard are averaged
        all_reduce_bucketed([local_tensor(p.grad) for p in params if p.grad is not None], rt.coords.cp_group,
                            average=True)
    if opts.debug_grad_scale != 1.0:
        for g in _held_grads(rt):
            local_tensor(g).mul_(opts.debug_grad_scale)


def optimizers(rt: Runtime) -> list:
    """The run's optimizers: rt.optimizer, and a mixture of experts' own under ZeRO-1/2 (build_optimizer)."""
    return [rt.optimizer] + ([rt.extra["expert_optimizer"]] if "expert_optimizer" in rt.extra else [])


def reduce_expert_gradients(rt: Runtime) -> None:
    """A mixture of experts' expert weights (parallel_layers.moe): each rank's gradient holds the contributions of
    the tokens its expert-parallel group sent it, so the ranks holding the same experts (the expert-data-parallel
    group, tp x cp x dp / ep of them) sum theirs (build_expert_grad_reduction, started during the backward where the
    dense reduction is), then divide as the dense gradients are divided (expert_divide)."""
    ered = rt.extra.get("expert_grad_reduction")
    if ered is not None:
        ered.finish()
        return
    # no other rank holds these experts, or (ZeRO-3) FSDP2 summed their shards over the group: the division alone
    divide = expert_divide(rt)
    if divide != 1:
        for p in rt.extra["expert_params"]:
            if grad_of(p) is not None:
                local_tensor(grad_of(p)).div_(divide)


def moe_runtime_problem(plan, opts: RunOptions) -> None:
    """What the runtime does not run for a mixture of experts (yet), raised before any group is made (parplan launch
    checks the same first: planner.launch.check_runtime_support)."""
    from planner.core import parplan_moe_problem
    p, t = plan.parallel, plan.training
    problem = parplan_moe_problem(p.zero_stage, t.moe_dispatcher, t.moe_recompute, t.fp8, p.recompute, plan=True,
                                  dp_replicate=p.dp_replicate)
    if problem:
        raise ValueError(f"{problem[0]}: {problem[1]}")


def mla_runtime_problem(plan) -> None:
    """What the runtime does not run for multi-head latent attention, raised before any group is made (parplan launch
    checks the same first: planner.launch.check_runtime_support)."""
    from planner.core import parplan_mla_problem
    problem = parplan_mla_problem(plan.parallel.cp, plan.training.fp8, plan.training.mla_recompute, plan=True)
    if problem:
        raise ValueError(f"{problem[0]}: {problem[1]}")


def unscale_gradients(rt: Runtime, opts: RunOptions, step: int) -> bool:
    """fp16 (parallel_layers.loss_scale): multiply the reduced gradients by 1/S and update S; whether any rank's
    gradients overflowed, when the step is skipped.  False without a scaler (bf16, fp32)."""
    scaler = rt.extra["scaler"]
    if scaler is None:
        return False
    grads = [local_tensor(g) for g in _held_grads(rt)]
    if opts.debug_overflow_step == step and dist.get_rank() == dist.get_world_size() - 1 and grads:
        grads[0].view(-1)[0] = float("inf")
    found = scaler.unscale_(grads, rt.device, rt.extra["stats_group"])
    scaler.update(found)
    return found


def _held_grads(rt: Runtime) -> list:
    """Every gradient this rank holds after the reduction: its parameters' (main_grad under master-weights, an FSDP2
    shard's local tensor) and ZeRO-2's reduced rows of split parameters."""
    return [g for _, g in _held_param_grads(rt)]


def _held_param_grads(rt: Runtime) -> list:
    """(parameter, gradient) for _held_grads."""
    params = _unique_params(rt.stage_modules)
    return [(p, grad_of(p)) for p in params if grad_of(p) is not None] + [(p, g) for g, p in _held_pieces(rt)]


def _held_pieces(rt: Runtime) -> list:
    """ZeRO-2's reduced rows of split parameters this rank owns, with their parameters (ShardedAdamW; a mixture of
    experts' expert weights split over their expert-data-parallel group by their own optimizer too)."""
    return [pc for opt in optimizers(rt) if isinstance(opt, ShardedAdamW) for pc in opt.held_piece_grads()]


def clip_gradients(rt: Runtime) -> Optional[torch.Tensor]:
    """The plan's global gradient-norm clipping (parallel_layers.clip), after the reduction: the norm
    before clipping, or None without clip_grad."""
    max_norm = rt.plan.training.clip_grad
    if max_norm is None:
        return None
    par = rt.plan.parallel
    return clip_grad_norm(rt.stage_modules, max_norm, tp=par.tp, dp=par.dp, cp=par.cp, pp=par.pp,
                          zero_stage=par.zero_stage, tied=rt.cfg.tied_embeddings, device=rt.device,
                          pieces=_held_pieces(rt), dp_replicate=par.dp_replicate, ep=par.ep)


def dump_gradients(rt: Runtime, directory: str, sample_indices: list[int]) -> None:
    """Each rank writes its reduced gradients keyed by logical name with its TP slice position,
    so a test can reassemble full tensors and compare layouts."""
    os.makedirs(directory, exist_ok=True)
    grads = {}
    # ZeRO-2's split parameters: their reduced rows assembled over dp (each owner holds its rows); a mixture of experts'
    # expert weights every one assembled over their expert-data-parallel group (whole), so each rank dumps its experts
    # as under ZeRO-0/1.  held_expert_grad_elements: what this rank itself holds of them after the reduction
    split = rt.optimizer.full_reduced_grads() if isinstance(rt.optimizer, ShardedAdamW) and rt.optimizer.stage == 2 else {}
    experts = rt.extra.get("expert_params", [])
    expert_ids = {id(p) for p in experts}
    held_expert = (sum(local_tensor(grad_of(p)).numel() for p in experts if grad_of(p) is not None)
                   + sum(g.numel() for g, p in _held_pieces(rt) if id(p) in expert_ids))
    eopt = rt.extra.get("expert_optimizer")
    if isinstance(eopt, ShardedAdamW) and eopt.stage == 2:
        split.update(eopt.full_reduced_grads(whole=True))
    for m in rt.stage_modules:
        for mod in m.modules():
            for attr, spec in getattr(mod, "param_specs", {}).items():
                g = grad_of(getattr(mod, attr))
                if g is None:
                    g = split.get(id(getattr(mod, attr)))
                if g is None:
                    continue
                if hasattr(g, "full_tensor"):
                    g = g.full_tensor()  # collective over dp: same order on every dp rank
                grads[spec.logical_name] = {"grad": g.detach().float().cpu().clone(), "tp_dim": spec.tp_dim,
                                            "tp_rank": mod.tp_rank, "tp_size": mod.tp_size,
                                            "full_shape": tuple(spec.full_shape)}
                if spec.ep_dim is not None:  # a mixture of experts' weights: the rank's experts
                    grads[spec.logical_name].update(ep_dim=spec.ep_dim, ep_rank=mod.ep_rank, ep_size=mod.ep_size)
    c = rt.coords
    torch.save({"rank": dist.get_rank(), "dp_rank": c.dp_rank, "pp_rank": c.pp_rank, "tp_rank": c.tp_rank,
                "cp_rank": c.cp_rank,
                "stage_ids": rt.stage_ids, "local_params": rt.local_params, "sample_indices": sample_indices,
                "zero_split_params": len(rt.optimizer.split) if isinstance(rt.optimizer, ShardedAdamW) else 0,
                "held_expert_grad_elements": held_expert,
                "grads": grads}, os.path.join(directory, f"rank{dist.get_rank()}.pt"))


def mean_loss_over_world(rt: Runtime, replica_loss: Optional[float]) -> float:
    """The global-batch mean loss, known on every rank: last-stage, tp-rank-0 ranks contribute
    their replica's loss / (dp x cp) (a cp rank's loss is the mean over its equal share of the
    tokens, so the cp-mean is the replica's loss)."""
    contrib = 0.0
    if replica_loss is not None and rt.coords.tp_rank == 0:
        contrib = replica_loss / (rt.plan.parallel.dp * rt.plan.parallel.cp)
    t = torch.tensor([contrib], dtype=torch.float64, device=rt.device)  # nccl needs device tensors
    dist.all_reduce(t, group=rt.extra.get("stats_group"))
    return float(t.item())


def step_phases(rt: Runtime, t0: float, t_fb: float, t_end: float) -> dict:
    """Where rank 0's step went, on its host clock: ``host_dispatch_s`` until the host had enqueued
    the last forward/backward kernel; ``fwd_bwd_s`` until the forward/backward was done on the device
    (the loss read waits for it; only on ranks holding the last stage, else null); ``after_s`` the
    gradient reduction and optimizer step after it.  A launch-bound run has host_dispatch_s close to
    fwd_bwd_s; a device-bound one ends its dispatch early.  ``host_forward_s`` (one-stage plans only, else
    null): until the host had enqueued the first micro-batch's forward and loss, before its backward."""
    dispatched = rt.extra.get("dispatched_at")
    forward = rt.extra.get("forward_dispatched_at")
    synced = rt.holds_last
    return {"host_dispatch_s": None if dispatched is None else dispatched - t0,
            "host_forward_s": None if forward is None else forward - t0,
            "fwd_bwd_s": t_fb - t0 if synced else None, "after_s": t_end - t_fb if synced else None}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sync_compute(device):
    """Wait for the compute stream only: the collectives still in flight on NCCL's streams (ZeRO-1/2's gathers of
    the stepped parameters) go on into the next step, whose forward waits for them part by part."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def model_flops_per_token(plan) -> float:
    from cost_models.params import spec_model_flops_per_token

    return spec_model_flops_per_token(plan.model, plan.training.seq_len)


def peak_tflops_per_gpu(plan, device: torch.device) -> Optional[float]:
    """Peak dense TFLOP/s of the plan's hardware profile for the compute dtype; None on CPU or
    when the profile cannot be loaded."""
    if device.type != "cuda":
        return None
    try:
        from hardware_profiles import load_profile

        prof = load_profile(plan.hardware.name)
        dtype = plan.training.dtype if plan.training.precision != "fp32" else "fp32"
        return prof.peak_dense_tflops.get(dtype)
    except Exception:  # profile loader missing or name unknown: MFU is reported as null
        return None


def peak_memory(device: torch.device, cpu_trace: Optional[dict] = None) -> dict:
    if device.type == "cuda":
        return {"allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device)}
    # CPU: no allocator statistics; the traced allocator peak when traced (--memory-snapshot), and
    # the process's peak resident set size
    out = {"allocated": None, "reserved": None, "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if cpu_trace is not None:
        out.update(allocated=cpu_trace["allocated"], peak_phase=cpu_trace["phase"],
                   allocated_without_collective_buffers=cpu_trace["without_collective_buffers"]["allocated"])
    return out


def _rel_error(predicted, measured):
    if predicted is None or measured in (None, 0):
        return None
    return (predicted - measured) / measured


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(f"{LOG_PREFIX} {msg}", flush=True)


def recompile_limit_hits() -> int:
    """How many times torch.compile has hit its recompile limit in this process (torch._dynamo's counters, which name
    it in their `unimplemented` reasons): past it, a code object's calls run uncompiled from then on, a step time the
    plan's prediction does not assume (2026-12-04's H200 dropout run, before the dropouts took their layer as a
    tensor).  0 where torch keeps no such counter."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - every torch this runs on has it
        return 0
    names = ("recompile limit", "recompile_limit", "cache size limit", "cache_size_limit")  # the older torch's name
    return sum(n for reason, n in counters.get("unimplemented", {}).items() if any(k in reason.lower() for k in names))


def run(plan, opts: RunOptions) -> Optional[dict]:
    """Train opts.steps steps (counting those done before a resume); the report on rank 0."""
    device = torch.device("cuda", torch.cuda.current_device()) if opts.device == "cuda" else torch.device("cpu")
    limit_hits = recompile_limit_hits()  # run_plans runs several plans in one process: this run's own, below
    if device.type == "cuda" and opts.memory_snapshot:  # from the start: weights and states are in the trace too
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")  # "all" slows every alloc
    # cpu: the CPU allocator's running total through the profiler, from before the model exists
    # 16-bit matmuls in fp32 on a CPU without native 16-bit GEMMs (cpu_matmul: what the run holds is unchanged)
    with trace_if(device.type == "cpu" and bool(opts.memory_snapshot)) as cpu_trace, \
            fp32_matmuls(device, param_dtype(plan)):
        rt, steps = _build_and_train(plan, opts, device)
    if cpu_trace.result is not None:
        path = cpu_trace.write(opts.memory_snapshot, dist.get_rank())
        peak = cpu_trace.result["allocated"]
        log(f"cpu allocator peak {'-' if peak is None else f'{peak / 2**20:.1f} MiB'} in {cpu_trace.result['phase']} ({path})")
    if device.type == "cuda" and opts.memory_snapshot:
        os.makedirs(opts.memory_snapshot, exist_ok=True)
        path = os.path.join(opts.memory_snapshot, f"rank{dist.get_rank()}.pickle")
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        log(f"memory snapshot {path} (open it at pytorch.org/memory_viz, or `python benchmarks/memory_peak.py {path}`)")
    world = dist.get_world_size()
    memories = [None] * world
    dist.all_gather_object(memories, peak_memory(device, cpu_trace.result))
    params_per_rank = [None] * world
    dist.all_gather_object(params_per_rank, rt.local_params)
    if dist.get_rank() != 0:
        return None
    red = rt.extra.get("grad_reduction")
    # rank 0's host and how fast it dispatches (a launch-bound step is its dispatch; hosts of one GPU kind differ),
    # measured after the last step
    host = {**host_info(), **dispatch_probe(device)}
    return build_report(plan, opts, device, steps, memories, params_per_rank, host=host,
                        wgrad_fusion=rt.extra.get("wgrad_fusion"), grad_overlap=None if red is None else red.overlap,
                        grad_buckets=None if red is None else red.last_step,
                        expert_grad_buckets=(None if rt.extra.get("expert_grad_reduction") is None
                                             else rt.extra["expert_grad_reduction"].last_step),
                        resumed_from=rt.extra.get("resumed_from"),
                        param_overlap=(rt.optimizer.overlap_gather if isinstance(rt.optimizer, ShardedAdamW)
                                       and plan.parallel.dp > 1 else None),
                        recompile_limit=recompile_limit_hits() - limit_hits,
                        fp8_cast_failure=fp8.cast_failure() if plan.training.fp8 else None,
                        profile=rt.extra.get("profile"))


def _build_and_train(plan, opts: RunOptions, device: torch.device):
    rt = build_runtime(plan, opts, device)
    tr, par = plan.training, plan.parallel
    data = TokenSource(plan.model.vocab, tr.seq_len, tr.seed, opts.data, opts.data_dtype)
    indices = replica_sample_indices(rt.coords.dp_rank, tr.micro_batch_size, tr.num_microbatches)
    start = 0
    if opts.resume:
        path = ckpt.latest(opts.checkpoint_dir, opts.resume_step)
        if path is None and opts.resume_step is not None:
            raise FileNotFoundError(f"no complete checkpoint of step {opts.resume_step} under {opts.checkpoint_dir}")
        if path is None:
            log(f"no checkpoint under {opts.checkpoint_dir}; starting from step 0")
        else:
            start = ckpt.load(path, rt.stage_modules, optimizers(rt), rt.extra["scaler"])
            rt.extra["resumed_from"] = {"checkpoint": path, "step": start}
            log(f"resumed from {path} (after step {start})")
    flops_per_token = model_flops_per_token(plan)
    peak = peak_tflops_per_gpu(plan, device)
    world = dist.get_world_size()
    tokens_per_step = tr.global_batch_size * tr.seq_len
    log(f"layout tp={par.tp} pp={par.pp} dp={par.dp} cp={par.cp} vpp={par.vpp} schedule={par.schedule} zero={par.zero_stage} "
        f"sp={par.sp} recompute={par.recompute} precision={tr.precision} offload={par.offload} device={device.type} world={world} params_rank0={rt.local_params}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps = []
    spans = []
    tel = _start_telemetry(opts, device)
    t0 = None
    for step in range(start + 1, opts.steps + 1 + bool(opts.profile)):
        profiling = step > opts.steps  # --profile: the step after the measured ones, on a clock of its own
        if t0 is None or profiling:
            _sync(device)
            t0 = time.perf_counter()
        prof = step_profile.start(device.type) if profiling else None
        with CpuMemoryTrace.phase(f"step{step}.fwd_bwd"):
            rt.optimizer.zero_grad(set_to_none=True)
            if "expert_optimizer" in rt.extra:
                rt.extra["expert_optimizer"].zero_grad(set_to_none=True)
            clear_grads(_unique_params(rt.stage_modules))
            inputs, targets = data.batch(step, indices)
            if rt.extra["dropout"] is not None:
                rt.extra["dropout"].begin_step(step, indices, tr.micro_batch_size)
            if par.cp > 1:  # this cp rank's two chunks of every sequence
                inputs = shard_sequence(inputs, rt.coords.cp_rank, par.cp)
                targets = shard_sequence(targets, rt.coords.cp_rank, par.cp)
            replica_loss = forward_backward(rt, inputs.to(device), targets.to(device))
        t_fb = time.perf_counter()
        with CpuMemoryTrace.phase(f"step{step}.after"):
            reduce_gradients(rt, opts)
            scale = loss_scale(rt) if rt.extra["scaler"] is not None else None
            skipped = unscale_gradients(rt, opts, step)
            if opts.dump_grads and step == start + 1:
                dump_gradients(rt, opts.dump_grads, indices)
            grad_norm = None
            if not skipped:  # an overflowed fp16 step changes nothing but the scale (every rank skips it)
                grad_norm = clip_gradients(rt)
                rt.optimizer.step()
                if "expert_optimizer" in rt.extra:  # (its broadcast of the stepped experts is waited for here)
                    rt.extra["expert_optimizer"].step()
        _sync_compute(device)
        t_end = time.perf_counter()
        if profiling:
            rt.extra["profile"] = p = step_profile.finish(prof, opts.profile, dist.get_rank(), step, t_end - t0,
                                                          device.type)
            log(f"profiled step {step} on rank {dist.get_rank()}: {(t_end - t0) * 1e3:.1f} ms; " +
                (p["error"] if "error" in p else f"tables and trace in {opts.profile} (rank{dist.get_rank()}.ops.md, "
                 ".ops.json, .trace.json.gz)"))
            break
        dt = torch.tensor([t_end - t0], dtype=torch.float64, device=device)
        # the step ends when the slowest rank ends
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=rt.extra["stats_group"])
        loss = mean_loss_over_world(rt, replica_loss)
        step_time = float(dt.item())
        tps = tokens_per_step / step_time
        mfu = flops_per_token * tps / (world * peak * 1e12) if peak else None
        norm = None if grad_norm is None else float(grad_norm)
        load = rt.extra["moe_state"].load_imbalance() if rt.extra.get("moe_state") is not None else None
        steps.append({"step": step, "loss": loss, "step_time_s": step_time, "tokens_per_s": tps, "mfu": mfu,
                      "grad_norm": norm, **step_phases(rt, t0, t_fb, t_end),
                      **({} if load is None else {"expert_load_imbalance": load}),
                      **({} if scale is None else {"loss_scale": scale, "skipped": skipped})})
        spans.append((t0, t_end))
        log(f"step {step}/{opts.steps} loss={loss:.6f} step_time_s={step_time:.4f} tokens_per_s={tps:.1f} "
            f"mfu={'null' if mfu is None else f'{mfu:.4f}'}" + ("" if norm is None else f" grad_norm={norm:.6g}")
            + ("" if scale is None else f" loss_scale={scale:g}" + (" skipped (inf/nan gradients)" if skipped else "")))
        # every checkpoint_every steps, and after the last step (Megatron's --save and torchtitan do the same)
        if opts.checkpoint_dir and ((opts.checkpoint_every and step % opts.checkpoint_every == 0) or step == opts.steps):
            settle_parameters(rt)
            path = ckpt.save(opts.checkpoint_dir, step, rt.stage_modules, optimizers(rt), rt.extra["scaler"])
            log(f"checkpoint {path}")
            t_end = None  # the save is no step's time
        # one clock from step to step: what runs between two steps (this bookkeeping, the gathers' tail) counts in
        # the next, and a step's time is the interval between the ends of the compute of two steps
        t0 = t_end
    settle_parameters(rt)
    if tel is not None:
        for st, values in zip(steps, per_step(tel.stop(), spans)):
            st.update(values)
    return rt, steps


def _start_telemetry(opts: RunOptions, device: torch.device):
    """Rank 0's GPU sampler (parallel_layers.telemetry), running, or None: off, another rank, or no nvidia-smi."""
    on = opts.telemetry if opts.telemetry is not None else device.type == "cuda"
    if not on or dist.get_rank() != 0:
        return None
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "")) if device.type == "cuda" else None
    tel = GpuTelemetry(uuid=uuid)
    return tel if tel.start() else None


def settle_parameters(rt: Runtime) -> None:
    """Wait for ZeRO-1/2's gathers of the stepped parameters still in flight (before anything but the next
    forward reads the parameters)."""
    if isinstance(rt.optimizer, ShardedAdamW):
        rt.optimizer.wait_gathers()


# the report's fp8_casts on a GPU, by parallel_layers.fp8.cast_mode() other than the default ("compiled")
FP8_CAST_WORDS = {"static": "compiled with static shapes", "hybrid": "amax by ATen, scaling and cast compiled",
                  "eager": "eager"}


def build_report(plan, opts: RunOptions, device, steps, memories, params_per_rank,
                 comparable: Optional[bool] = None, wgrad_fusion: Optional[bool] = None,
                 grad_overlap: Optional[bool] = None, param_overlap: Optional[bool] = None,
                 grad_buckets: Optional[dict] = None, resumed_from: Optional[dict] = None,
                 expert_grad_buckets: Optional[dict] = None,
                 recompile_limit: int = 0, fp8_cast_failure: Optional[str] = None,
                 profile: Optional[dict] = None, host: Optional[dict] = None) -> dict:
    """The run report.  ``error`` compares with the plan's prediction only when the run is
    comparable (on cuda; a CPU/gloo run is no measurement of the plan's GPUs): null otherwise.
    wgrad_fusion: whether the weight gradients were accumulated by the fused GEMM (None: no main_grad).
    grad_overlap: whether the data-parallel reduction started during the backward (None: FSDP2, or no dp group).
    param_overlap: whether ZeRO-1/2's parameter gather ran beside the next forward (None: no ZeRO-1/2 over dp > 1).
    grad_buckets: rank 0's reduction in the last step, {"buckets", "started_in_backward"} (None where grad_overlap is).
    resumed_from: {"checkpoint": its folder, "step": the step it was saved after} of a resumed run, else None.
    fp8_cast_failure: why rank 0's FP8 casts fell back to eager on the GPU (fp8.cast_failure()), else None.
    profile: rank 0's profiled step (opts.profile: parallel_layers.step_profile.finish's summary), else None.
    host: rank 0's host and its dispatch probes (run measures them after the last step), else None."""
    if comparable is None:
        comparable = device.type == "cuda"
    warmup = opts.warmup_steps if opts.warmup_steps is not None else min(2, len(steps) // 2)
    measured = steps[warmup:] or steps
    # an fp16 step skipped for overflowed gradients ran no clipping and no optimizer step: not a training step's time
    stepped = [s for s in measured if not s.get("skipped")]
    skipped_out = len(measured) - len(stepped) if stepped else 0
    measured = stepped or measured
    med = lambda key: (statistics.median(s[key] for s in measured)  # noqa: E731
                       if measured and all(s.get(key) is not None for s in measured) else None)

    def at_median_step(key):
        """A rate (tokens/s, MFU: work per step over the step's time) at the median step time, so the
        report's rates and its step time agree (the median of 1/t is not 1/median t over an even count)."""
        t = med("step_time_s")
        if t is None or not t or not all(s.get(key) is not None and s.get("step_time_s") for s in measured):
            return med(key)
        return statistics.median(s[key] * s["step_time_s"] for s in measured) / t
    pred = plan.prediction if comparable else None
    reserved = [m["reserved"] for m in memories if m.get("reserved") is not None]
    error = {
        "step_time_s": _rel_error(pred.step_time_s if pred else None, med("step_time_s")),
        "peak_memory": _rel_error(pred.memory_bytes_per_gpu.total if pred else None, max(reserved) if reserved else None),
        "mfu": _rel_error(pred.mfu if pred else None, at_median_step("mfu")),
    }
    traced = [m["allocated_without_collective_buffers"] for m in memories
              if m.get("allocated_without_collective_buffers") is not None]
    cpu_memory = None
    dropout = ({"hidden": opts.hidden_dropout, "attention": opts.attention_dropout} if plan.training.dropout
               else None)
    if traced and len(traced) == len(memories):
        # The CPU allocator's peak is comparable with the plan's memory model where the CPU runs the GPU's
        # storage dtypes (fp32, or bf16 parameters with fp32 masters); collective staging buffers are
        # gloo's own (NCCL writes into the caller's tensors), so they are left out of the comparison.
        # amp autocasts only on a GPU (autocast_dtype): on the CPU its activations are fp32, not the plan's 16-bit
        # ones, so its peak is reported without a prediction to compare
        amp = plan.training.precision == "amp"
        # the attention's dropout runs torch's SDPA math path on the CPU (no fused kernel takes a dropout there),
        # which keeps score-sized tensors a fused kernel on the GPU does not
        math_attention = dropout is not None and dropout["attention"] > 0 and plan.training.flash_attention
        mem = plan.prediction.memory_bytes_per_gpu if plan.prediction else None
        predicted = mem.total if mem is not None and not amp and not math_attention else None
        # optimizer offload: on the CPU the "host" is the device, so the offloaded states sit in the same allocator
        # (the GPU's total leaves them out, and the comparison had read 7 % low where it read +10 % without offload)
        offloaded = (mem.offloaded or 0.0) if mem is not None and plan.parallel.offload != "none" else 0.0
        predicted = predicted + offloaded if predicted is not None else None
        cpu_memory = {"allocated_max": max(m["allocated"] for m in memories), "without_collective_buffers_max": max(traced),
                      "predicted": predicted, "error": _rel_error(predicted, max(traced))}
        if amp:
            cpu_memory["note"] = "amp runs in fp32 on the CPU (no autocast): not comparable with its 16-bit prediction"
        elif math_attention:
            cpu_memory["note"] = ("attention dropout runs scaled_dot_product_attention's math path on the CPU (score-"
                                  "sized tensors): not comparable with the fused-attention prediction")
        elif offloaded:
            cpu_memory["note"] = (f"optimizer offload: predicted is the GPU's total plus the {offloaded / 2**20:.1f} MiB "
                                  "offloaded, which a CPU run holds in the same memory")
    notes = [] if comparable else [f"{device.type}: {cpu_math(plan)}; not comparable with the prediction for "
                                   f"{plan.hardware.name}, so error is null"]
    scales = [s["loss_scale"] for s in steps if "loss_scale" in s]
    loss_scaling = None
    if scales:
        loss_scaling = {"first": scales[0], "last": scales[-1],
                        "skipped_steps": [s["step"] for s in steps if s.get("skipped")]}
        if skipped_out:
            notes.append(f"{skipped_out} step(s) after warm-up skipped for inf/nan fp16 gradients (loss scale halved) "
                         "are left out of the medians")
    if param_overlap is not None and param_overlap != plan_overlaps_param_gather(plan.training):
        notes.append(f"the runtime {'gathered' if param_overlap else 'did not gather'} the stepped parameters during "
                     f"the next forward; the prediction assumed it {'did not' if param_overlap else 'did'}")
    if grad_overlap is not None and grad_overlap != plan_overlaps_grad_reduce(plan.training, plan.parallel):
        notes.append(f"the runtime {'started' if grad_overlap else 'did not start'} the data-parallel gradient "
                     f"reduction during the backward; the prediction assumed it {'did not' if grad_overlap else 'did'}")
    if wgrad_fusion is not None and wgrad_fusion != plan_fuses_wgrad(plan.training, plan.parallel):
        notes.append(f"the runtime {'did' if wgrad_fusion else 'did not'} fuse the gradient accumulation into the "
                     f"weight-gradient GEMMs; the prediction assumed it {'did not' if wgrad_fusion else 'did'}")
    fp8_casts = None
    if plan.training.fp8:
        mode = fp8.cast_mode()
        fp8_casts = ("eager (cpu)" if device.type != "cuda" else
                     f"eager (torch.compile failed: {fp8_cast_failure})" if fp8_cast_failure else
                     "compiled" if mode == "dynamic" else f"{FP8_CAST_WORDS[mode]} ({fp8.CAST_ENV}={mode})")
        if fp8_cast_failure and device.type == "cuda":
            notes.append(f"the FP8 casts ran eagerly on rank 0, torch.compile having failed on them ({fp8_cast_failure}):"
                         " four elementwise passes a cast more than the prediction's one amax and one cast pass")
    if recompile_limit:
        notes.append(f"torch.compile hit its recompile limit {recompile_limit} time(s) on rank 0: those code objects "
                     "ran uncompiled from then on, so the step time is slower than the prediction assumes (run with "
                     "TORCH_LOGS=recompiles to see what changed between calls)")
    return {
        "plan": json.loads(plan.model_dump_json()),
        "device": device.type if device.type != "cuda" else torch.cuda.get_device_name(device),
        "wgrad_fusion": wgrad_fusion,
        "overlap_grad_reduce": grad_overlap,
        "overlap_param_gather": param_overlap,
        "grad_reduce_buckets": grad_buckets,
        # a mixture of experts: rank 0's expert-gradient reduction over its expert-data-parallel group, as above
        "expert_grad_reduce_buckets": expert_grad_buckets,
        "torch_version": torch.__version__,
        "host": host,
        "world_size": len(memories),
        "resumed_from": resumed_from,
        "warmup_steps": warmup,
        "loss_scaling": loss_scaling,
        "dropout": dropout,
        "fp8_casts": fp8_casts,
        "profile": profile,  # rank 0's --profile step (parallel_layers.step_profile.summary, with its files)
        "steps": steps,
        "median": {"step_time_s": med("step_time_s"), "tokens_per_s": at_median_step("tokens_per_s"),
                   "mfu": at_median_step("mfu"),
                   "host_dispatch_s": med("host_dispatch_s"), "host_forward_s": med("host_forward_s"),
                   "fwd_bwd_s": med("fwd_bwd_s"), "after_s": med("after_s"),
                   **{k: med(k) for k in TELEMETRY_FIELDS if med(k) is not None}},
        "peak_memory_bytes": {str(r): m for r, m in enumerate(memories)},
        "cpu_memory": cpu_memory,
        "params_per_rank": params_per_rank,
        "model_flops_per_token": model_flops_per_token(plan),
        "prediction": json.loads(plan.prediction.model_dump_json()) if plan.prediction else None,
        "error": error,
        "notes": notes,
    }


def init_distributed(device: str) -> None:
    if "RANK" not in os.environ:  # plain `python -m parallel_layers.train`: a one-rank job
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
    else:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        dist.init_process_group("gloo")


def shutdown() -> None:
    if dist.is_initialized():
        dist.barrier()  # without it an intermittent SIGABRT at exit makes torchrun return 1
        dist.destroy_process_group()


def load_plan(path: str):
    from planner.schema import Plan

    with open(path) as f:
        return Plan.model_validate_json(f.read())


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m parallel_layers.train", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan JSON (planner.schema.Plan)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--report", help="write the report JSON here (rank 0)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--data", help="flat token file (np.memmap)")
    ap.add_argument("--data-dtype", choices=["uint16", "uint32"], help="token dtype of --data (default by vocab size)")
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--resume-step", type=int, help="with --resume: the checkpoint written after this step (default the newest)")
    ap.add_argument("--warmup-steps", type=int)
    ap.add_argument("--dump-grads", help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help=argparse.SUPPRESS)
    ap.add_argument("--debug-grad-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    ap.add_argument("--wgrad-fusion", choices=list(WGRAD_FUSION_MODES), default="auto",
                    help="master-weights: accumulate weight gradients into fp32 main_grad inside the GEMM (auto: on "
                         "CUDA where torch has the fp32-output GEMM; reference: its arithmetic on any device)")
    ap.add_argument("--overlap-grad-reduce", choices=["on", "off"], default="on",
                    help="ZeRO 0-2: start the data-parallel gradient reduction during the backward (on), or after it")
    ap.add_argument("--overlap-param-gather", choices=["on", "off"], default="on",
                    help="ZeRO-1/2: broadcast the stepped parameters during the next forward (on), or after the step")
    ap.add_argument("--memory-snapshot", help="directory: record the CUDA allocator's history and dump it per rank")
    ap.add_argument("--profile", help="directory: run one step more than --steps under torch.profiler and write each "
                                      "rank's operator tables and trace there (not on cpu with --memory-snapshot, "
                                      "which traces the allocator with the profiler)")
    ap.add_argument("--initial-loss-scale", type=float,
                    help="fp16 plans: the dynamic loss scale's start (default 65536, torch's GradScaler's; Megatron-LM "
                         "starts at 4294967296)")
    ap.add_argument("--debug-overflow-step", type=int, help=argparse.SUPPRESS)
    for what in ("hidden", "attention"):
        ap.add_argument(f"--{what}-dropout", type=float, default=MEGATRON_DROPOUT,
                        help=f"plans with training.dropout: the {what} dropout rate (default {MEGATRON_DROPOUT}, "
                             "Megatron-LM's)")
    ap.add_argument("--dropout-masks", choices=["auto", "hash", "keyed"], default="auto",
                    help="plans with training.dropout: the hidden masks hashed where --compile compiles the blocks "
                         "and keyed draws where not (auto), or one of the two (parallel_layers.dropout)")
    ap.add_argument("--moe-aux-loss-coeff", type=float, default=MOE_AUX_LOSS_COEFF,
                    help="a mixture of experts: the auxiliary load-balancing loss's coefficient (default "
                         f"{MOE_AUX_LOSS_COEFF}, as `parplan export --to megatron` writes; 0 for none)")
    ap.add_argument("--moe-balanced-routing", action="store_true",
                    help="a mixture of experts: route every expert the same share of each rank's tokens (the balance "
                         "the prediction assumes; for measuring, as Megatron-LM's --moe-router-force-load-balancing)")
    a = ap.parse_args(argv)
    for what in ("hidden", "attention"):
        p = getattr(a, f"{what}_dropout")
        if not 0.0 <= p < 1.0:
            ap.error(f"--{what}-dropout must be in [0, 1), got {p}")
    if not (a.moe_aux_loss_coeff >= 0 and math.isfinite(a.moe_aux_loss_coeff)):
        ap.error(f"--moe-aux-loss-coeff must be 0 or more, got {a.moe_aux_loss_coeff}")
    if a.profile and a.memory_snapshot and a.device == "cpu":
        ap.error("--profile and --memory-snapshot on cpu both need torch.profiler: run them separately")
    if a.initial_loss_scale is not None and not (a.initial_loss_scale > 0 and math.isfinite(a.initial_loss_scale)):
        ap.error(f"--initial-loss-scale must be a positive number, got {a.initial_loss_scale}")
    return a


def options_from_args(a: argparse.Namespace) -> RunOptions:
    return RunOptions(steps=a.steps, device=a.device, data=a.data, data_dtype=a.data_dtype,
                      checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, resume=a.resume,
                      resume_step=a.resume_step,
                      warmup_steps=a.warmup_steps, dump_grads=a.dump_grads, optimizer=a.optimizer,
                      debug_grad_scale=a.debug_grad_scale, compile=a.compile,
                      memory_snapshot=a.memory_snapshot, wgrad_fusion=a.wgrad_fusion,
                      overlap_grad_reduce=a.overlap_grad_reduce == "on",
                      overlap_param_gather=a.overlap_param_gather == "on",
                      initial_loss_scale=a.initial_loss_scale, debug_overflow_step=a.debug_overflow_step,
                      hidden_dropout=a.hidden_dropout, attention_dropout=a.attention_dropout,
                      dropout_masks=a.dropout_masks, moe_aux_loss_coeff=a.moe_aux_loss_coeff,
                      moe_balanced_routing=a.moe_balanced_routing, profile=a.profile)


def write_report(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


def report_failure(exc: BaseException) -> None:
    rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
    print(f"{LOG_PREFIX} rank {rank} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    run_plans(a.device, [(a.plan, options_from_args(a), a.report)])
    return 0


def run_plans(device: str, jobs, between_jobs=None) -> None:
    """Start the process group once, train each (plan path, RunOptions, report path or None) in turn,
    write rank 0's reports, and shut down; a failure is reported with this rank and re-raised.
    between_jobs, if given, is called on every rank after each job (the multi-rank tests' teardown)."""
    try:
        init_distributed(device)
        for plan_path, opts, report_path in jobs:
            report = run(load_plan(plan_path), opts)
            if report is not None and report_path:
                write_report(report, report_path)
            if between_jobs is not None:
                between_jobs()
        shutdown()
    except BaseException as exc:
        report_failure(exc)
        raise


if __name__ == "__main__":
    sys.exit(main())
