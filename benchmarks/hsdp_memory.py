"""ZeRO-3's hybrid sharding against full sharding on parplan's runtime: the memory model against the CPU allocator's
peak (4 gloo ranks, the wide model of tests/test_runtime_memory.py's LAYOUTS), with the largest blocks live at the
peak, and the losses of the two runs (the same plan but for the sharding: they must match).

    OMP_NUM_THREADS=1 python benchmarks/hsdp_memory.py --out benchmarks/results/DATE-cpu-memory-hsdp
    OMP_NUM_THREADS=1 python benchmarks/hsdp_memory.py --cp --out benchmarks/results/DATE-cpu-memory-hsdp-cp

One 4-rank torchrun of both plans with ``--memory-snapshot`` (parallel_layers/host_memory.py), as
benchmarks/cpu_memory.py runs every layout; --cp: the same beside context parallelism 2, 8 ranks (dp 4 in 2
replicas of 2 shards, each cp rank's; the cp replicas average their gradient shards after).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tests.test_runtime_memory as T  # noqa: E402
from tests.runtime_helpers import suite  # noqa: E402

CASES = {"fsdp2-pp1": T.LAYOUTS["fsdp2-pp1"],
         # FSDP2 over (2 replicas, 2 shards): each rank holds half the model states (fsdp2-pp1: a quarter)
         "hsdp-pp1": (4, dict(tp=1, pp=1, dp=4, zero_stage=3, dp_replicate=2))}
# beside cp 2 (8 ranks): full sharding over the 4 dp ranks against 2 replicas of 2 (parplan's runtime shards over dp)
CASES_CP = {"fsdp2-cp2": (4, dict(tp=1, pp=1, dp=4, cp=2, zero_stage=3)),
            "hsdp-cp2": (4, dict(tp=1, pp=1, dp=4, cp=2, zero_stage=3, dp_replicate=2))}
MIB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cp", action="store_true", help="the two plans beside context parallelism 2, on 8 ranks")
    a = ap.parse_args()
    cases, ranks = (CASES_CP, 8) if a.cp else (CASES, 4)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="parplan-hsdp-memory-"))
    layouts, T.LAYOUTS = T.LAYOUTS, cases
    try:
        jobs = T.memory_jobs(tmp, schedules={})
    finally:
        T.LAYOUTS = layouts
    r = suite.run_jobs(jobs, ranks, tmp, "memory", timeout=1500)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
        return 1
    lines = [f"# FSDP2 full and hybrid sharding{' beside cp 2' if a.cp else ''} on {ranks} gloo ranks "
             f"({datetime.date.today()}, {platform.machine()}, "
             f"Python {platform.python_version()})", "",
             f"`OMP_NUM_THREADS=1 python benchmarks/hsdp_memory.py{' --cp' if a.cp else ''} --out <this folder>`: one run, the CPU allocator's "
             "peak without gloo's staging buffers (the largest rank's), against `evaluate`'s total.", "",
             "| plan | predicted MiB | measured MiB | error | step losses |", "|---|---|---|---|---|"]
    tops = []
    for name in cases:
        rep = json.loads((tmp / name / "report.json").read_text())
        cm = rep["cpu_memory"]
        losses = ", ".join(f"{s['loss']:.6f}" for s in rep["steps"])
        lines.append(f"| {name} | {cm['predicted'] / MIB:.1f} | {cm['without_collective_buffers_max'] / MIB:.1f} | "
                     f"{cm['error']:+.1%} | {losses} |")
        trace = json.loads((tmp / name / "trace" / "rank0.json").read_text())
        tops += ["", f"{name}, rank 0, the largest blocks live at its peak ({trace['phase']}):", ""]
        tops += [f"- {row['bytes'] / MIB:.2f} MiB ({row['count']} x {row['block_bytes'] / MIB:.2f}): {row['op']}"
                 for row in sorted(trace["live_at_peak"], key=lambda x: -x["bytes"])[:10]]
        (out / f"{name}.report.json").write_text(json.dumps(rep, indent=1))
    (out / "memory.md").write_text("\n".join(lines + tops) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
