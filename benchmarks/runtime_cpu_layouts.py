"""CPU (gloo) step time of one tiny llama plan in several 8-rank layouts, all in one torchrun
invocation, plus the one-rank run; a reproducible record of what the runtime costs on CPU and a
smoke check that every layout trains to the same loss.

    python benchmarks/runtime_cpu_layouts.py --out runs/runtime_cpu_layouts.json [--steps 6]

The numbers are CPU/gloo timings of a 0.18M-parameter model: start-up and communication
latency dominate, so they say nothing about GPU speed.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime_helpers import suite  # noqa: E402
from tests.runtime_helpers.plans import TINY_LLAMA, tiny_plan  # noqa: E402

LAYOUTS = {
    "tp2-pp2-dp2 1f1b": dict(tp=2, pp=2, dp=2),
    "tp2-pp2-dp2 zbv": dict(tp=2, pp=2, dp=2, schedule="zbv", vpp=2),
    "tp2-pp2-dp2 sp fsdp2": dict(tp=2, pp=2, dp=2, sp=True, zero_stage=3),
    "tp2-pp1-dp4": dict(tp=2, pp=1, dp=4),
    "tp1-pp4-dp2 1f1b": dict(tp=1, pp=4, dp=2),
    "tp1-pp1-dp8 zero1": dict(tp=1, pp=1, dp=8, zero_stage=1),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="parplan-bench-"))
    ref = [suite._job(tmp, "one-rank", tiny_plan(TINY_LLAMA), {"dump_grads": None}, steps=a.steps)]
    par = [suite._job(tmp, name.replace(" ", "_"), tiny_plan(TINY_LLAMA, **lay), {"dump_grads": None}, steps=a.steps)
           for name, lay in LAYOUTS.items()]
    rows = []
    for jobs, nproc in ((ref, 1), (par, 8)):
        t0 = time.time()
        r = suite.run_jobs(jobs, nproc, tmp, f"bench{nproc}")
        if r.returncode:
            sys.stderr.write(r.stderr[-4000:])
            return r.returncode
        wall = time.time() - t0
        for job in jobs:
            rep = json.loads(Path(job["report"]).read_text())
            rows.append({"layout": Path(job["report"]).parent.name, "ranks": nproc,
                         "median_step_time_s": rep["median"]["step_time_s"],
                         "final_loss": rep["steps"][-1]["loss"], "invocation_wall_s": wall})
    out = {"torch_version": __import__("torch").__version__, "machine": platform.processor() or platform.machine(),
           "steps": a.steps, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    for row in rows:
        print(f"{row['layout']:28s} ranks={row['ranks']} step={row['median_step_time_s']:.4f}s loss={row['final_loss']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
