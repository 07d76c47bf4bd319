"""How fast this host dispatches, by two fixed probes of a few milliseconds: a chain of tiny in-place adds on a CPU
tensor (the Python-to-ATen dispatch of one op) and, on a GPU, the same on a CUDA tensor without a sync (one kernel's
launch path).  A launch-bound step is the host's dispatch time, and hosts of one GPU kind differ (2026-12-06's H100
host ran the launch-bound 1.3B 1.3-1.7x slower than 2026-11-22/23's) where lscpu reads alike, so a run report's `host`
and `parplan calibrate` record both: a later run can be compared with the host its profile's host_block_s was
measured on.  The cost model does not read them."""
from __future__ import annotations

import statistics
import time

import torch

OPS = 1000
REPEATS = 5


def _per_op_us(x: torch.Tensor, ops: int, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats + 1):  # the first a warm-up
        sync()
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        times.append(time.perf_counter() - t0)
    sync()
    return statistics.median(times[1:]) / ops * 1e6


def dispatch_probe(device: torch.device, ops: int = OPS, repeats: int = REPEATS) -> dict:
    """{"probe_cpu_op_us": ..., and on a GPU "probe_cuda_launch_us": ...}: the median over `repeats` of `ops` tiny
    in-place adds, microseconds an op (host time only: the GPU runs them after)."""
    out = {"probe_cpu_op_us": round(_per_op_us(torch.zeros(16), ops, repeats, lambda: None), 3)}
    if device.type == "cuda":
        try:
            out["probe_cuda_launch_us"] = round(_per_op_us(torch.zeros(16, device=device), ops, repeats,
                                                           lambda: torch.cuda.synchronize(device)), 3)
        except (RuntimeError, AssertionError):  # a device that cannot run it: the report goes on without it
            out["probe_cuda_launch_us"] = None
    return out
