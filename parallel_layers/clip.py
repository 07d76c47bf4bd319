"""Gradient clipping by the global 2-norm, over every parallel dimension.

The norm is the one a single rank would compute on the unsplit model (torch.nn.utils.clip_grad_norm_,
Megatron-LM's clip_grad_norm_fp32): each rank sums the squares of the gradients it holds after the
reduction, each divided by the number of ranks holding an identical copy, and one all-reduce over
the world adds them.  Copies of a gradient:
  - tensor parallel: parameters not split over TP (norms, row-parallel biases) are the same on every
    TP rank (sequence parallelism's partial gradients have been summed by then);
  - data parallel: ZeRO-0 and parplan's ZeRO-1 (all-reduce) leave the whole gradient on every dp
    rank; ZeRO-2 on its owner only (a parameter split over dp ranks: each owner its rows, passed in as
    ``pieces``); FSDP2 a disjoint shard on each, or under hybrid sharding on each of dp_replicate replicas;
  - context parallel: the cp ranks hold averaged replicas;
  - pipeline: a tied embedding's gradient is summed into both its copies (first and last stage);
  - experts (parallel_layers.moe): an expert's reduced gradient is on each of the tp x cp x dp / ep ranks holding it
    under ZeRO-0/1; under ZeRO-2 on its owner among them only (a split one's rows each on theirs, as ``pieces``);
    under ZeRO-3 a disjoint FSDP2 shard on each of them.
Every local gradient is then multiplied by min(1, max_norm / (norm + 1e-6)) on the device, with no
host synchronisation, as torch's clip_grad_norm_ does.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from parallel_layers.data_parallel import local_tensor
from parallel_layers.model import iter_shard_specs
from parallel_layers.precision import grad_of

EPS = 1e-6


def copies(spec, *, tp: int, dp: int, cp: int, pp: int, zero_stage: int, tied: bool, dp_replicate: int = 1,
           ep: int = 1) -> int:
    """Ranks in the world holding the same gradient as this one (see the module docstring)."""
    if getattr(spec, "ep_dim", None) is not None:  # a mixture of experts' weights: the expert-data-parallel group,
        return 1 if zero_stage == 2 else dp_replicate if zero_stage >= 3 else tp * cp * dp // ep  # whose ZeRO-2
        # keeps them on their owner alone, ZeRO-3 (FSDP2) a disjoint shard on each, or on each replica group's ranks
    n = cp * (dp if zero_stage in (0, 1) else dp_replicate if zero_stage >= 3 else 1)
    if spec.tp_dim is None:
        n *= tp
    if tied and pp > 1 and spec.logical_name == "embedding.weight":
        n *= 2
    return n


def local_gradients(stage_modules, *, tp: int, dp: int, cp: int, pp: int, zero_stage: int, tied: bool, pieces=(),
                    dp_replicate: int = 1, ep: int = 1):
    """(local gradient tensor, copies in the world) for every gradient this rank holds; pieces: (gradient rows,
    their parameter) held apart from the parameter (ZeRO-2's split parameters, data_parallel.ShardedAdamW)."""
    seen, spec_of = set(), {}
    for m in stage_modules:
        for _, p, spec in iter_shard_specs(m):
            spec_of.setdefault(id(p), spec)
            g = grad_of(p)
            if g is None or id(p) in seen:
                continue
            seen.add(id(p))
            yield local_tensor(g), copies(spec, tp=tp, dp=dp, cp=cp, pp=pp, zero_stage=zero_stage, tied=tied,
                                          dp_replicate=dp_replicate, ep=ep)
    for g, p in pieces:
        yield g, copies(spec_of[id(p)], tp=tp, dp=dp, cp=cp, pp=pp, zero_stage=zero_stage, tied=tied,
                        dp_replicate=dp_replicate, ep=ep)


def clip_grad_norm(stage_modules, max_norm: float, *, tp: int, dp: int, cp: int, pp: int, zero_stage: int,
                   tied: bool, device: torch.device, pieces=(), dp_replicate: int = 1, ep: int = 1) -> torch.Tensor:
    """Scale this rank's gradients so the whole model's gradient has 2-norm at most max_norm; returns
    the norm before clipping (a 0-d fp32 tensor on `device`, identical on every rank)."""
    # one foreach norm and one foreach multiply per (device, dtype, copies): FSDP2's offloaded shards live
    # on the host, and torch's clip_grad_norm_ groups by device and dtype alike
    groups: dict = {}
    for g, n in local_gradients(stage_modules, tp=tp, dp=dp, cp=cp, pp=pp, zero_stage=zero_stage, tied=tied,
                                pieces=pieces, dp_replicate=dp_replicate, ep=ep):
        groups.setdefault((g.device, g.dtype, n), []).append(g)
    return scale_to_norm(groups, max_norm, device)


def scale_to_norm(groups: dict, max_norm: float, device: torch.device) -> torch.Tensor:
    """clip_grad_norm's passes over gradients grouped by (device, dtype, copies in the world): the norm (all-reduced
    over the world where there is one), then every gradient multiplied by the clamped coefficient; the norm.  Also
    what `parplan calibrate`'s optimizer probe times (planner.calibrate.measure_optimizer)."""
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for (_, _, n), gs in groups.items():
        sq += torch.stack(torch._foreach_norm(gs, 2, dtype=torch.float32)).pow(2).sum().to(device) / n
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + EPS), max=1.0)
    for (dev, dtype, _), gs in groups.items():
        torch._foreach_mul_(gs, coef.to(device=dev, dtype=dtype))
    return norm
