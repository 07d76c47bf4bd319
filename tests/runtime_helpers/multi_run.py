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


def main(path: str) -> int:
    with open(path) as f:
        jobs = json.load(f)
    try:
        train.init_distributed("cpu")
        for job in jobs:
            plan = train.load_plan(job["plan"])
            report = train.run(plan, train.RunOptions(**job["opts"]))
            if report is not None:
                train.write_report(report, job["report"])
            release_memory()
        train.shutdown()
    except BaseException as exc:
        train.report_failure(exc)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
