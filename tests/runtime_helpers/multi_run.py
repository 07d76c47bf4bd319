"""Run several training jobs inside one torchrun invocation (process start-up dominates the
multi-rank test time).  Usage:

    torchrun --nproc-per-node 8 -m tests.runtime_helpers.multi_run jobs.json

jobs.json: a list of {"plan": path, "report": path, "opts": {RunOptions fields}}, run in order
over the same default process group (each builds its own mesh).
"""
from __future__ import annotations

import ctypes
import gc
import json
import sys

import torch
import torch.distributed as dist

from parallel_layers import train


def release_memory() -> None:
    """Hand a finished job's memory back before the next starts.  Without it each rank grew by 0.2-0.6 GiB a
    job (the CPU memory trace's profiler events and the job's model, left to the cyclic collector and then
    kept by glibc's arenas): by the memory suite's 24th job 4 GiB a rank, 16 GiB over 4 ranks on a 24 GiB
    machine with the page cache squeezed out, and its cp2-tp2-sp-selective-op job (55 s alone) ran over 6
    minutes before it was stopped.  With it: 0.5 GiB a rank after 8 jobs (3.4 without), 1.1 GiB at the 25th,
    and that job 59 s (2026-11-28, this 2-core machine)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def release_groups() -> None:
    """Destroy the process groups a finished job made (its mesh's, the stats group, embedding groups), keeping
    the world group the next job builds its own from.  Kept, they piled up: every gloo group holds its own
    threads and connections on every rank, 172 threads a rank after 16 jobs, and the same 1f1b job's step
    time rose 0.33 s -> 0.5 s over those 16 jobs; the 8-rank suite's 48th of 49 jobs, a cp4 resume, took 67 s
    a step there against 2.2 s alone (2026-11-29, this 2-core machine).

    DTensor caches sharding decisions keyed by specs whose DeviceMesh compares equal to any mesh of the same
    shape and dim names, so a later job of an earlier job's shape was handed specs holding the earlier mesh,
    and with it a destroyed group ("Could not resolve the process group registered under the name ...").
    Those caches are cleared with the groups; a stale mesh that got through would fail that loudly, not
    compute on the wrong ranks."""
    dist.barrier()  # no rank still talking over a group another is about to tear down
    world = dist.group.WORLD
    for group in list(dist.distributed_c10d._world.pg_map):
        if group is not world:
            dist.destroy_process_group(group)
    _clear_dtensor_caches()


def _clear_dtensor_caches() -> None:
    """The caches as torch 2.13 names them.  Another torch may lack or rename some; one left uncleared shows up
    as the error above on a later job of the same mesh shape, not as wrong numbers."""
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute, _sharding_prop

    for owner, name in ((DTensor._op_dispatcher.sharding_propagator, "propagate_op_sharding"),
                        (_sharding_prop.ShardingPropagator, "_propagate_tensor_meta_cached"),
                        (_redistribute, "_gen_transform_infos"),
                        (_collective_utils.MeshTopoInfo, "build_from_mesh")):
        cached = getattr(owner, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    # the planner instances by mesh, and the C++ fast path's sharding cache (what debug._clear_sharding_prop_cache
    # clears beside the Python one)
    for clear in (getattr(_redistribute, "clear_redistribute_planner_cache", None),
                  getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)):
        if clear is not None:
            clear()


def release() -> None:
    """What one job leaves behind, before the next starts."""
    release_groups()
    release_memory()


def main(path: str) -> int:
    with open(path) as f:
        jobs = json.load(f)
    # what the imports made (torch, sympy, the runtime: ~290,000 objects) left out of every collection: release()'s
    # gc.collect() had walked them all after each job, 0.15 s a rank alone and 0.67 s with 8 ranks on 2 cores,
    # a third of rank 0's time over the multi-rank suite's first 8 jobs (2026-12-06, cProfile); after the freeze the
    # collection walks only what the jobs made
    gc.freeze()
    train.run_plans("cpu", [(j["plan"], train.RunOptions(**j["opts"]), j["report"]) for j in jobs],
                    between_jobs=release)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
