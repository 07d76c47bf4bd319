"""The memory model against the CPU allocator's peak for plans with their own pipeline split (Parallel.stage_layers,
predicted as written since the thirty-eighth session: cost_models.layout.ModelDims.split), each pipeline rank kind
against its own rank.

    OMP_NUM_THREADS=1 python benchmarks/split_memory.py --out benchmarks/results/DATE-cpu-memory-split

One 4-rank gloo torchrun of each plan with ``--memory-snapshot`` (tests/test_runtime_memory.py's schedules model:
llama, 8 layers (10 where it says so), hidden 256, ffn 704, vocab 512, seq 512, micro-batch 2, 8 micro-batches, pp 4, master-weights).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime_helpers import suite  # noqa: E402
import tests.test_runtime_memory as runtime_memory  # noqa: E402

# blocks per virtual stage (8 layers): a head stage lightened to no block (as `recommend --split balanced` gives a
# small model with a large vocabulary), the blocks piled on rank 0, uneven chunks under interleaving and ZB-V (rank
# 0's two chunks 1 and 0 blocks), and the recompute modes over a head stage without blocks
CASES = {
    "1f1b-head-light": dict(schedule="1f1b", stage_layers=[2, 3, 3, 0]),
    "1f1b-first-heavy": dict(schedule="1f1b", stage_layers=[4, 2, 1, 1]),
    "interleaved-split": dict(schedule="interleaved-1f1b", vpp=2, stage_layers=[2, 1, 1, 1, 1, 1, 1, 0]),
    "zbv-split": dict(schedule="zbv", vpp=2, stage_layers=[1, 1, 1, 2, 1, 1, 1, 0]),
    "1f1b-full-split": dict(schedule="1f1b", recompute="full", stage_layers=[2, 3, 3, 0]),
    "1f1b-selective-split": dict(schedule="1f1b", recompute="selective", stage_layers=[2, 3, 3, 0]),
    "1f1b-full-1-split": dict(schedule="1f1b", recompute="full", recompute_layers=1, stage_layers=[2, 3, 3, 0]),
    # ZB-V's default split of 10 blocks (1, 2, 2, 1, 1, 1, 1, 1): unequal chunks on ranks 1 and 2 without a split of
    # the plan's own
    "zbv-default-10-layers": dict(schedule="zbv", vpp=2, layers=10),
    # interleaved zero-bubble (torch's ScheduleInterleavedZeroBubble) with uneven chunks, counted in stage units (the
    # rank's mean chunk), unlike ZB-V's walk: a plan's own split and the default split of 10 blocks
    "interleaved-zb-split": dict(schedule="interleaved-zb", vpp=2, stage_layers=[2, 1, 1, 1, 1, 1, 1, 0]),
    "interleaved-zb-head-light": dict(schedule="interleaved-zb", vpp=2, stage_layers=[1, 1, 1, 1, 1, 2, 1, 0]),
    "interleaved-zb-default-10-layers": dict(schedule="interleaved-zb", vpp=2, layers=10),
}
MIB = 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    out = Path(a.out)
    cases = {k: v for k, v in CASES.items() if not a.only or k in a.only.split(",")}
    out.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="parplan-split-"))  # the plans, reports and traces (a few MB), not kept
    runtime_memory.LAYOUTS, layouts = {}, runtime_memory.LAYOUTS  # the schedules' narrow model only
    try:
        jobs = runtime_memory.memory_jobs(run, 2, cases, "master-weights", micro_batch_size=2)
    finally:
        runtime_memory.LAYOUTS = layouts
    t0 = time.time()
    r = suite.run_jobs(jobs, 4, run, "memory", timeout=1200)
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        return 1
    print(f"{len(cases)} plans: {time.time() - t0:.0f} s", file=sys.stderr)
    import torch
    rows, errors = [], {}
    for name in cases:
        rep = json.loads((run / name / "report.json").read_text())
        plan = json.loads((run / name / "plan.json").read_text())
        cm = rep["cpu_memory"]
        kinds = runtime_memory.rank_kind_errors(plan, rep)
        errors[name] = {"largest": cm["error"], **kinds}
        cells = " | ".join(f"{100 * kinds[k]:+.1f}%" if k in kinds else "" for k in ("first", "middle", "last"))
        rows.append(f"| {name} | {plan['parallel']['stage_layers']} | {cm['predicted'] / MIB:.1f} | "
                    f"{cm['without_collective_buffers_max'] / MIB:.1f} | {100 * cm['error']:+.1f}% | {cells} |")
    lines = [f"# A plan's own pipeline split against the CPU allocator ({datetime.date.today()}, "
             f"{platform.machine()}, torch {torch.__version__}, 4 gloo ranks, one run)", "",
             f"`OMP_NUM_THREADS=1 python benchmarks/split_memory.py --out {a.out}`: the largest rank's peak without "
             "gloo's staging buffers against `evaluate`'s total, and each pipeline rank kind (rank 0, the fullest "
             "middle rank, the last) against its own rank.  llama, 8 layers (10 where it says so), hidden 256, ffn "
             "704, vocab 512, seq 512, micro-batch 2, 8 micro-batches, pp 4, master-weights.", "",
             "| plan | stage_layers | predicted MiB | measured MiB | largest | first | middle | last |",
             "|---|---|---|---|---|---|---|---|", *rows, ""]
    (out / "README.md").write_text("\n".join(lines))
    (out / "errors.json").write_text(json.dumps(errors, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
