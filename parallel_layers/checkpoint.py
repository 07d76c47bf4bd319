"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Keys are logical parameter names; a TP shard adds ``@tp{rank}of{tp}`` (DCP treats equal keys
of plain tensors as replicas, which is right for the dp copies and wrong for TP shards).  FSDP2
parameters and their AdamW states are DTensors over dp, and layer keys use the global layer
index, so a checkpoint resumes with another dp, pp or ZeRO stage (tested: dp 2 -> 1, and
pp 2 -> 1 with ZeRO-1 -> FSDP2); another tp is not supported (TP shards are separate keys).  Data needs no state: batches are a function of (seed, step, index).
"""
from __future__ import annotations

import os
import re

import torch
import torch.distributed.checkpoint as dcp



def _key(mod_tp_size: int, mod_tp_rank: int, spec) -> str:
    if spec.tp_dim is not None and mod_tp_size > 1:
        return f"{spec.logical_name}@tp{mod_tp_rank}of{mod_tp_size}"
    return spec.logical_name


def keyed_parameters(stage_modules) -> dict[str, torch.nn.Parameter]:
    out = {}
    for m in stage_modules:
        for mod in m.modules():
            for attr, spec in getattr(mod, "param_specs", {}).items():
                out[_key(mod.tp_size, mod.tp_rank, spec)] = getattr(mod, attr)
    return out


def _ensure_adamw_state(optim: torch.optim.Optimizer) -> None:
    """Create zero AdamW states (as AdamW would on its first step) so DCP can load in place."""
    for group in optim.param_groups:
        for p in group["params"]:
            if p in optim.state and optim.state[p]:
                continue
            on_device = group.get("fused") or group.get("capturable")
            optim.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu"),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def state_dict(stage_modules, optim: torch.optim.Optimizer | None, step: int, create_optim_state: bool = False) -> dict:
    params = keyed_parameters(stage_modules)
    sd = {"model": dict(params), "optim": {}, "meta": {"step": torch.tensor(step)}}
    if optim is not None:
        if create_optim_state:
            _ensure_adamw_state(optim)
        by_param = {id(p): k for k, p in params.items()}
        for p, st in optim.state.items():
            k = by_param[id(p)]
            for name, value in st.items():
                sd["optim"][f"{k}/{name}"] = value
    return sd


def save(directory: str, step: int, stage_modules, optim) -> str:
    path = os.path.join(directory, f"step_{step:08d}")
    dcp.save(state_dict(stage_modules, optim, step), checkpoint_id=path)
    return path


def latest(directory: str) -> str | None:
    if not directory or not os.path.isdir(directory):
        return None
    steps = [d for d in os.listdir(directory) if re.fullmatch(r"step_\d+", d)
             and os.path.exists(os.path.join(directory, d, ".metadata"))]
    return os.path.join(directory, max(steps)) if steps else None


def load(path: str, stage_modules, optim) -> int:
    """Load in place; returns the step the checkpoint was written after."""
    sd = state_dict(stage_modules, optim, 0, create_optim_state=True)
    dcp.load(sd, checkpoint_id=path)
    return int(sd["meta"]["step"].item())
