"""Pipeline parallelism with torch.distributed.pipelining: which layers each virtual stage
holds, which virtual stages each rank holds, and the schedule the plan names.

Virtual-stage order: ``stage_layers[v]`` blocks for virtual stage v = 0 .. pp*vpp-1.  Rank r
holds stages r, r+pp, r+2pp, ... (loop placement of interleaved schedules); for zbv the
V-shape placement ScheduleZBVZeroBubble expects: rank r holds r and 2*pp-1-r.  The placement and the
default split are the cost model's (cost_models.layout.stages_of_rank, stage_layers), shared with the
planner.  Stage 0 holds the embedding, the last stage the final norm, head and loss.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from cost_models.compute import queued_weight_pass_plan
from cost_models.layout import stage_layers as default_split
from parallel_layers.layers import WeightGradStore, defer_weight_grads
from parallel_layers.precision import fold_pending_grads

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}
SINGLE_STAGE = {"gpipe", "1f1b"}


def virtual_stage_layers(n_layers: int, pp: int, vpp: int, stage_layers: list[int] | None) -> list[list[int]]:
    """Global layer ids of each virtual stage, in virtual-stage order."""
    # the default split is the cost model's (cost_models.layout.stage_layers), so a plan without stage_layers
    # trains the split it was predicted with
    counts = list(stage_layers) if stage_layers is not None else default_split(n_layers, pp * vpp)
    if len(counts) != pp * vpp or sum(counts) != n_layers:
        raise ValueError(f"stage_layers {counts} must have pp*vpp = {pp * vpp} entries summing to {n_layers}")
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def weight_pass_builder(plan, stage_module):
    """The stage's dw_builder: where the plan's zero-bubble weight passes are queued (cost_models.compute.
    queued_weight_pass_plan: every zero-bubble pipeline outside FSDP2), its blocks' linears queue their weight
    gradients in a WeightGradStore whose ``take`` gives each micro-batch's weight pass; the input-gradient pass
    then frees the block's graph and a checkpointed block is re-run once, not once per parameter group.  Else
    None (torch's own pass)."""
    if not queued_weight_pass_plan(plan.parallel):
        return None
    store = WeightGradStore()
    defer_weight_grads(stage_module.blocks, store)
    return store.take


def build_schedule(plan, stage_modules: list, stage_ids: list[int], pp_group, device, loss_fn,
                   scale_grads: bool = True, before_forward=None):
    """PipelineStage per local module and the schedule named in plan.parallel.schedule.
    Gradients are divided by the micro-batch count (scale_grads), so with a per-micro-batch
    mean loss the result is the mean over the replica's batch (scale_grads=False: the caller
    divides, as for fp32 main_grad buffers the schedule does not see).  before_forward(micro_batch): called
    before each micro-batch's forward on every local stage (the dropout key, parallel_layers.dropout)."""
    par = plan.parallel
    n_stages = par.pp * par.vpp
    stages = [just_in_time_receives(PipelineStage(m, sid, n_stages, device, group=pp_group,
                                                  dw_builder=weight_pass_builder(plan, m)))
              for m, sid in zip(stage_modules, stage_ids)]
    if par.schedule in LOOPED_RUNTIME:
        stages = [release_output_sends(st) for st in stages]
    if before_forward is not None:
        stages = [announce_forward(st, before_forward) for st in stages]
    cls = SCHEDULES[par.schedule]
    nmb = plan.training.num_microbatches
    if par.schedule in SINGLE_STAGE:
        return cls(stages[0], n_microbatches=nmb, loss_fn=loss_fn, scale_grads=scale_grads)
    return cls(stages, n_microbatches=nmb, loss_fn=loss_fn, scale_grads=scale_grads)


def announce_forward(stage, before_forward):
    """The stage with before_forward(micro-batch index) called before each forward it runs."""
    forward_one_chunk = stage.forward_one_chunk

    def announced(fwd_chunk_id, *a, **k):
        before_forward(fwd_chunk_id)
        return forward_one_chunk(fwd_chunk_id, *a, **k)
    stage.forward_one_chunk = announced
    return stage


class _RecvMeta(NamedTuple):
    """What a receive descriptor needs to make its buffer again, and the 0-element tensor it holds meanwhile."""
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    placeholder: torch.Tensor


def _release(infos) -> None:
    """Drop the stage's reference to each receive buffer (autograd, or a send in flight, keeps its own)."""
    for info in infos or ():
        if getattr(info, "_jit_meta", None) is not None:
            info.buffer = info._jit_meta.placeholder


def _allocate(infos) -> None:
    """A fresh buffer for each receive about to be posted, where the stage holds only the placeholder."""
    for info in infos or ():
        meta = getattr(info, "_jit_meta", None)
        if meta is not None and info.buffer is meta.placeholder:
            info.buffer = torch.empty(meta.shape, dtype=meta.dtype, device=meta.device).requires_grad_(meta.requires_grad)


def _to_placeholders(infos_by_chunk: dict) -> None:
    """Replace every buffer torch made up front with a placeholder, keeping its shape (_RecvMeta)."""
    for infos in infos_by_chunk.values():
        for info in infos:
            buf = getattr(info, "buffer", None)
            if isinstance(buf, torch.Tensor) and getattr(info, "_jit_meta", None) is None:
                info._jit_meta = _RecvMeta(buf.shape, buf.dtype, buf.device, buf.requires_grad,
                                           torch.empty(0, dtype=buf.dtype, device=buf.device))
                info.buffer = info._jit_meta.placeholder


def just_in_time_receives(stage):
    """Receive buffers that exist only while a micro-batch needs them, as Megatron's do.

    torch.distributed.pipelining (torch 2.5-2.13) allocates, for every micro-batch of the step, one
    activation buffer per stage input and one gradient buffer per stage output when the schedule first
    runs, and keeps them all for the stage's life: m x 2 hidden states per stage where a 1F1B rank has
    at most p micro-batches in flight (pytorch/pytorch#136380; upstream's own fix, allocating just in
    time, is pytorch/pytorch#196463).  Here each descriptor keeps only a 0-element placeholder and the
    buffer's shape: a buffer is made when its receive is posted and dropped by the stage once that
    micro-batch's backward has run (what autograd still holds for a split backward stays alive through
    autograd), and the last stage's loss lets go of its graph then (_drop_graph), which otherwise holds
    every received activation to the step's end.  Wraps the instance's methods that both torch 2.11 and
    2.13 call: _prepare_forward_infra and _prepare_backward_infra (which make the buffers),
    get_fwd_recv_ops / get_bwd_recv_ops (which post the receives), backward_one_chunk and
    backward_weight_one_chunk."""
    names = ("_prepare_forward_infra", "_prepare_backward_infra", "get_fwd_recv_ops", "get_bwd_recv_ops",
             "backward_one_chunk", "backward_weight_one_chunk")
    if not all(hasattr(stage, n) for n in names + ("args_recv_info", "grad_recv_info")):
        import warnings
        warnings.warn(f"torch {torch.__version__}'s PipelineStage lacks the methods just_in_time_receives wraps; "
                      "its receive buffers stay per micro-batch (more memory than the plan predicts)", stacklevel=2)
        return stage
    orig = {n: getattr(stage, n) for n in names}

    def prepare_forward(*a, **k):
        out = orig["_prepare_forward_infra"](*a, **k)
        _to_placeholders(stage.args_recv_info)
        return out

    def prepare_backward(*a, **k):
        out = orig["_prepare_backward_infra"](*a, **k)
        _to_placeholders(stage.grad_recv_info)
        return out

    def fwd_recv_ops(chunk):
        _allocate(stage.args_recv_info.get(chunk))
        return orig["get_fwd_recv_ops"](chunk)

    def bwd_recv_ops(chunk):
        _allocate(stage.grad_recv_info.get(chunk))
        return orig["get_bwd_recv_ops"](chunk)

    pending_losses: dict = {}

    def backward_one_chunk(chunk, *a, **k):
        out = orig["backward_one_chunk"](chunk, *a, **k)
        _release(stage.args_recv_info.get(chunk))
        _release(stage.grad_recv_info.get(chunk))
        loss = k.get("loss", a[0] if a else None)
        if k.get("full_backward", a[1] if len(a) > 1 else True) or stage.dw_builder is not None:
            _drop_graph(loss)
        else:  # torch's zero-bubble weight pass still needs the graph (a queued one does not: weight_pass_builder)
            pending_losses[chunk] = loss
        return out

    def backward_weight_one_chunk(chunk, *a, **k):
        out = orig["backward_weight_one_chunk"](chunk, *a, **k)
        _drop_graph(pending_losses.pop(chunk, None))
        # torch's weight pass (under FSDP2) assigns or adds dW to p.grad directly (stage_backward_weight), past the
        # master-weights hook: fold this micro-batch's into the fp32 main_grad now, not the step's bf16 sum (the
        # queued pass adds into main_grad itself: layers._queue_weight_grads)
        fold_pending_grads(stage.submod.parameters())
        return out

    stage._prepare_forward_infra = prepare_forward
    stage._prepare_backward_infra = prepare_backward
    stage.get_fwd_recv_ops = fwd_recv_ops
    stage.get_bwd_recv_ops = bwd_recv_ops
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk
    return stage


# torch's action-list runtime (_PipelineScheduleRuntime) under the looped schedules: rank r holds stages r, r + p, ...
LOOPED_RUNTIME = {"interleaved-1f1b", "interleaved-zb"}


class _SendOps(list):
    """A stage's forward send ops, marked with the (stage, micro-batch) they carry (release_output_sends)."""
    key: tuple = ()


class _HeldSend:
    """What torch's runtime keeps of a forward send (send_ops, drained when the step ends): a handle that
    waits on the send only while release_output_sends has not already, so the real work, and with it the
    sent tensor, need not live to the step's end."""
    __slots__ = ("_registry", "_key", "_i")

    def __init__(self, registry: dict, key: tuple, i: int):
        self._registry, self._key, self._i = registry, key, i

    def wait(self, *a, **k) -> bool:
        works = self._registry.get(self._key)
        if works is not None and works[self._i] is not None:
            works[self._i].wait(*a, **k)
            works[self._i] = None
        return True

    def is_completed(self) -> bool:
        works = self._registry.get(self._key)
        return works is None or works[self._i] is None or works[self._i].is_completed()


_SEND_REGISTRY: dict = {}  # (id of the stage, micro-batch) -> that forward send's works, until released


def _patch_batch_p2p() -> None:
    """torch's runtime sends with the module-level _batch_p2p: for a stage's marked forward sends, keep the
    works here and give the runtime handles instead (once per process)."""
    import torch.distributed.pipelining.schedules as S
    if getattr(S._batch_p2p, "_parplan", False):
        return
    orig = S._batch_p2p

    def batch_p2p(p2p_ops, desc=None):
        works = orig(p2p_ops, desc=desc)
        key = getattr(p2p_ops, "key", ())
        if not key or not works:
            return works
        _SEND_REGISTRY[key] = list(works)
        return [_HeldSend(_SEND_REGISTRY, key, i) for i in range(len(works))]

    batch_p2p._parplan = True
    S._batch_p2p = batch_p2p


def release_output_sends(stage):
    """Wait on a stage's forward send of a micro-batch right after that micro-batch's backward, and let go
    of it there, rather than when the step ends.

    torch's action-list runtime (interleaved 1F1B and the zero-bubble schedules, torch 2.5-2.13) keeps every
    send's work until the step ends, and with it the sent tensor (gloo's SendWork holds it; NCCL unstashes
    its references only in wait()), so a rank holds all the stage outputs it sent, after their backward has
    freed its own copy.  The backward of (stage, micro-batch) consumes the gradient the next stage computed
    from this very output, so that send has completed and its wait returns at once: no new dependency
    between ranks (the placement upstream proposes for its WAIT_SEND_F actions, pytorch/pytorch#194121;
    #194120 retires sends by polling, which gloo's sends do not answer before wait()).  Gradient sends have
    no answering traffic and are still drained when the step ends; the memory model counts them
    (cost_models.memory.rank_inflight, TrainingConsts.p2p_output_sends_released)."""
    if not all(hasattr(stage, n) for n in ("get_fwd_send_ops", "backward_one_chunk")):
        return stage
    _patch_batch_p2p()
    get_sends, backward = stage.get_fwd_send_ops, stage.backward_one_chunk

    def fwd_send_ops(chunk):
        ops = _SendOps(get_sends(chunk))
        ops.key = (id(stage), chunk)
        return ops

    def backward_one_chunk(chunk, *a, **k):
        out = backward(chunk, *a, **k)
        for w in _SEND_REGISTRY.pop((id(stage), chunk), None) or ():
            if w is not None:
                w.wait()
        return out

    stage.get_fwd_send_ops = fwd_send_ops
    stage.backward_one_chunk = backward_one_chunk
    return stage


def _drop_graph(loss) -> None:
    """The last stage's loss, once its backward is done: the schedule keeps every micro-batch's loss
    until the step ends (to return them), and a loss with its graph keeps the graph's leaves, the
    received activations among them, alive.  Detached in place, it keeps only its value."""
    if isinstance(loss, torch.Tensor) and loss.grad_fn is not None and not loss._is_view():
        loss.detach_()
