"""Pipeline parallelism with torch.distributed.pipelining: which layers each virtual stage
holds, which virtual stages each rank holds, and the schedule the plan names.

Virtual-stage order: ``stage_layers[v]`` blocks for virtual stage v = 0 .. pp*vpp-1.  Rank r
holds stages r, r+pp, r+2pp, ... (loop placement of interleaved schedules); for zbv the
V-shape placement ScheduleZBVZeroBubble expects: rank r holds r and 2*pp-1-r.  Stage 0 holds
the embedding, the last stage the final norm, head and loss.
"""
from __future__ import annotations

from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from parallel_layers.model import split_layers

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
    counts = list(stage_layers) if stage_layers is not None else split_layers(n_layers, pp * vpp)
    if len(counts) != pp * vpp or sum(counts) != n_layers:
        raise ValueError(f"stage_layers {counts} must have pp*vpp = {pp * vpp} entries summing to {n_layers}")
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def stages_of_rank(pp_rank: int, pp: int, vpp: int, schedule: str) -> list[int]:
    """Virtual stage indices held by a pipeline rank, in the order the schedule wants them."""
    if pp == 1:
        return list(range(vpp))
    if schedule == "zbv":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(vpp)]


def build_schedule(plan, stage_modules: list, stage_ids: list[int], pp_group, device, loss_fn,
                   scale_grads: bool = True):
    """PipelineStage per local module and the schedule named in plan.parallel.schedule.
    Gradients are divided by the micro-batch count (scale_grads), so with a per-micro-batch
    mean loss the result is the mean over the replica's batch (scale_grads=False: the caller
    divides, as for fp32 main_grad buffers the schedule does not see)."""
    par = plan.parallel
    n_stages = par.pp * par.vpp
    stages = [PipelineStage(m, sid, n_stages, device, group=pp_group) for m, sid in zip(stage_modules, stage_ids)]
    cls = SCHEDULES[par.schedule]
    nmb = plan.training.num_microbatches
    if par.schedule in SINGLE_STAGE:
        return cls(stages[0], n_microbatches=nmb, loss_fn=loss_fn, scale_grads=scale_grads)
    return cls(stages, n_microbatches=nmb, loss_fn=loss_fn, scale_grads=scale_grads)
