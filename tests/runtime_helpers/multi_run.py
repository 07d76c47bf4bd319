"""Run several training jobs inside one torchrun invocation (process start-up dominates the
multi-rank test time).  Usage:

    torchrun --nproc-per-node 8 -m tests.runtime_helpers.multi_run jobs.json

jobs.json: a list of {"plan": path, "report": path, "opts": {RunOptions fields}}, run in order
over the same default process group (each builds its own mesh).
"""
from __future__ import annotations

import json
import sys

from parallel_layers import train


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
        train.shutdown()
    except BaseException as exc:
        train.report_failure(exc)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
