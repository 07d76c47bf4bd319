"""Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision Training", sec. 3.2).

fp16 holds magnitudes from 6e-8 (subnormal) to 65504; gradients below that range flush to zero.  The loss is
multiplied by a scale S before the backward, so every gradient is S times larger and stays representable; after
the data-parallel reduction the gradients are multiplied by 1/S.  A step whose gradients overflowed (an inf or NaN
anywhere in the model, on any rank) is skipped, and S is halved; after ``growth_interval`` steps in a row without
one S is doubled.  S is a power of two, so scaling and unscaling are exact wherever nothing over- or underflows.

The rule and its constants are torch.amp.GradScaler's (init_scale 2**16, growth_factor 2, backoff_factor 0.5,
growth_interval 2000).  Megatron-LM's DynamicGradScaler is the same rule with other defaults
(--initial-loss-scale 2**32, --loss-scale-window 1000, --hysteresis 2, --min-loss-scale 1): from 2**32 its first
dozen or more steps are skipped, which a short `parplan launch` would spend all of.  parplan's runtime runs one
check over the gradients each rank holds after the reduction (torch's fused _amp_foreach_non_finite_check_and_unscale_,
one read and one write of each gradient: cost_models.compute.loss_scale_time), and one all-reduce of the flag over
every rank, so that all ranks skip the same steps (torch's GradScaler checks per device, which would let the ranks of
one model disagree).  The bf16 and fp32 recipes have no scaler: bf16 has fp32's exponent range.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional

import torch
import torch.distributed as dist

from cost_models.compute import scales_loss

INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


def wants_loss_scaling(plan) -> bool:
    """fp16 16-bit training (the amp and master-weights recipes); not fp32, and not bf16 (the cost model's rule)."""
    return scales_loss(plan.training.dtype, plan.training.precision)


class DynamicLossScaler:
    """The scale S and its update rule (module docstring); the check is `unscale_`."""

    def __init__(self, init_scale: float = INIT_SCALE, growth_factor: float = GROWTH_FACTOR,
                 backoff_factor: float = BACKOFF_FACTOR, growth_interval: int = GROWTH_INTERVAL):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("loss scaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                             "growth_interval >= 1")
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0  # steps in a row without an overflow since the last change of S
        self.skipped = 0  # steps skipped in this run

    def unscale_(self, grads: Iterable[torch.Tensor], device: torch.device,
                 group: Optional[dist.ProcessGroup] = None) -> bool:
        """Multiply every gradient by 1/S in place and say whether any rank's holds an inf or NaN (the same answer
        on every rank of `group`: the world when None).  One host synchronisation (the flag's all-reduce is read)."""
        by_place = defaultdict(list)  # the fused kernel takes one device and dtype at a time
        for g in grads:
            by_place[(g.device, g.dtype)].append(g)
        found = torch.zeros(1, device=device)
        for (place, _), gs in by_place.items():
            flag = torch.zeros(1, device=place)
            inv = torch.full((), 1.0 / self.scale, device=place)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, inv)
            found += flag.to(device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX, group=group)
        return bool(found.item() > 0)

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state(self) -> dict:
        """What a checkpoint keeps, to resume the same run."""
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
