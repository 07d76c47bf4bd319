"""The memory model against the CPU allocator's peak, per ZeRO stage and pipeline (the layouts of
tests/test_runtime_memory.py), written as a markdown table with what was live at each peak.

    OMP_NUM_THREADS=1 python benchmarks/cpu_memory.py --out benchmarks/results/DATE-cpu-memory [--runs 3] [--precision fp32]

Each run is one 4-rank gloo torchrun of every layout with ``--memory-snapshot`` (the CPU allocator
traced through torch.profiler, parallel_layers/host_memory.py).  Repeated runs show the spread.
``--precision`` picks the recipe of every plan: master-weights (the test's) or fp32; the CPU runs both in
the GPU's storage dtypes, so both compare.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime_helpers import suite  # noqa: E402
from tests.test_runtime_memory import LAYOUTS, SCHEDULES, memory_jobs, rank_kind_errors  # noqa: E402

# recorded here, not asserted in the test: more recomputation under the zero-bubble schedules.  torch's own
# weight-gradient pass re-ran a fully recomputed block's forward once per weight and held every re-run (7 for a
# llama block, in the live-at-peak tables of 2026-11-23); since 2026-11-25 the runtime queues the linears' weight
# gradients instead (parallel_layers.layers.WeightGradStore; the test holds zbv-full and
# interleaved-zb-selective-op)
EXTRA = {"zbv-selective": dict(schedule="zbv", vpp=2, recompute="selective"),
         "interleaved-zb-full": dict(schedule="interleaved-zb", vpp=2, recompute="full"),
         "zbv-selective-op": dict(schedule="zbv", vpp=2, recompute="selective-op"),
         "tp2-sp-pp2-zbv-full": dict(tp=2, pp=2, schedule="zbv", vpp=2, sp=True, recompute="full")}
CASES = {**LAYOUTS, **SCHEDULES, **EXTRA}

MIB = 2**20
# the recipes the CPU runs in the GPU's storage dtypes (amp autocasts only on a GPU: not comparable)
RECIPES = {"master-weights": "master-weights (bf16 parameters, fp32 gradients, fp32 masters + AdamW)",
           "fp32": "fp32 (fp32 parameters, gradients and AdamW states; fp32 activations and working buffers)"}


def _repredict(rep: dict, plan_path: Path) -> dict:
    """The report with its prediction re-made by this checkout's cost model."""
    from planner.core import evaluate_plan
    from planner.schema import Plan
    pred = evaluate_plan(Plan.model_validate_json(plan_path.read_text())).prediction
    rep["prediction"] = json.loads(pred.model_dump_json())
    cm = rep["cpu_memory"]
    cm["predicted"] = pred.memory_bytes_per_gpu.total
    cm["error"] = cm["predicted"] / cm["without_collective_buffers_max"] - 1
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--precision", choices=list(RECIPES), default="master-weights",
                    help="every plan's recipe (with --repredict the committed plans' own recipe is used)")
    ap.add_argument("--repredict", action="store_true",
                    help="run nothing: re-predict the runs already under --out with this checkout's cost model "
                         "(the measured peaks do not depend on it) and rewrite summary.md")
    a = ap.parse_args()
    out = Path(a.out)
    if a.repredict:  # the runs the folder holds (a committed folder may hold one), not --runs
        a.runs = 0
        while (out / f"run{a.runs + 1}").is_dir():
            a.runs += 1
        if not a.runs:
            print(f"error: {out} holds no run1/ to re-predict", file=sys.stderr)
            return 2
    names = list(CASES)
    if a.repredict:  # a folder made before a case was added holds fewer: re-predict those it has
        names = [n for n in CASES if (out / "run1" / n / "report.json").is_file()]
        left = [n for n in CASES if n not in names]
        if left:
            print(f"note: {out} predates {len(left)} of today's cases ({', '.join(left)}); re-predicting the "
                  f"{len(names)} it holds", file=sys.stderr)
    rows, live = {n: [] for n in names}, {}
    for i in range(a.runs):
        tmp = out / f"run{i + 1}"
        t0 = time.time()
        if not a.repredict:
            r = suite.run_jobs(memory_jobs(tmp, a.steps, {**SCHEDULES, **EXTRA}, a.precision), 4, tmp, "memory",
                               timeout=1200)
            if r.returncode != 0:
                print(r.stderr[-4000:], file=sys.stderr)
                return 1
            print(f"run {i + 1}: {time.time() - t0:.0f} s", file=sys.stderr)
        for name in names:
            rep = json.loads((tmp / name / "report.json").read_text())
            if a.repredict:
                rep = _repredict(rep, tmp / name / "plan.json")
            rows[name].append(rep)
            if i == 0:
                ranks = rep["peak_memory_bytes"]
                worst = max(ranks, key=lambda k: ranks[k]["allocated_without_collective_buffers"])
                trace = json.loads((tmp / name / "trace" / f"rank{worst}.json").read_text())
                live[name] = (worst, trace["without_collective_buffers"])
    import torch
    # the recipe the runs were made with (the committed plans' under --repredict)
    precisions = {rep["plan"]["training"]["precision"] for reps in rows.values() for rep in reps}
    precision = precisions.pop() if len(precisions) == 1 else a.precision
    lines = [f"# Memory model vs the CPU allocator ({datetime.date.today()}, {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, 4 gloo ranks, {a.runs} runs)", "",
             f"Command: `OMP_NUM_THREADS=1 python benchmarks/cpu_memory.py --out {a.out} --runs {a.runs}"
             + (f" --precision {precision}" if precision != "master-weights" else "")
             + (" --repredict`: the predictions re-made by this checkout's cost model, the peaks as measured when the "
                "runs were made (the traces' dates)." if a.repredict else "`."),
             "ZeRO layouts: llama, hidden 1024, ffn 2816, 8 heads, vocab 4096, seq 32, micro-batch 1, global batch 8 "
             "(model states dominate). Schedules: llama, 8 layers, hidden 256, ffn 704, 4 heads, vocab 512, seq 512, "
             "micro-batch 2, 8 micro-batches, pp 4 (activations and pipeline buffers dominate). "
             f"Recipe {RECIPES.get(precision, precision)} throughout.",
             "Measured: the largest rank's peak without gloo's collective staging buffers, MiB.", "",
             "| layout | predicted | measured (each run) | error (each run) | weights | grads | optimizer | other |",
             "|---|---:|---|---|---:|---:|---:|---:|"]
    for name, reps in rows.items():
        mem = reps[0]["prediction"]["memory_bytes_per_gpu"]
        meas = [rep["cpu_memory"]["without_collective_buffers_max"] for rep in reps]
        errs = [rep["cpu_memory"]["error"] for rep in reps]
        lines.append(f"| {name} | {mem['total'] / MIB:.1f} | {' / '.join(f'{m / MIB:.1f}' for m in meas)} | "
                     f"{' / '.join(f'{100 * e:+.1f}%' for e in errs)} | {mem['weights'] / MIB:.1f} | "
                     f"{mem['grads'] / MIB:.1f} | {mem['optimizer'] / MIB:.1f} | {mem['other'] / MIB:.1f} |")
    lines += ["", "## Each pipeline rank kind against its own rank", "",
              "The model's totals for pipeline rank 0 (first), the fullest middle rank (1; pp - 2 under the "
              "zero-bubble schedules) and the last rank, against that rank's traced peak (tests/test_runtime_memory.py "
              "holds the largest to 10 % and each kind to 15 %; interleaved-uneven's kinds to 10 %).", "",
              "| layout | first (each run) | middle (each run) | last (each run) |", "|---|---|---|---|"]
    for name, reps in rows.items():
        plan = json.loads((out / "run1" / name / "plan.json").read_text())
        errs = [rank_kind_errors(plan, rep) for rep in reps]
        if not errs[0]:
            continue
        cells = [" / ".join(f"{100 * e[k]:+.1f}%" for e in errs) if k in errs[0] else "" for k in ("first", "middle", "last")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Live at the peak (run 1, the largest rank)", ""]
    for name, (rank, tr) in live.items():
        lines += [f"### {name} (rank {rank}: {tr['allocated'] / MIB:.1f} MiB in {tr['phase']})", "",
                  "| allocated by | block bytes | count | MiB |", "|---|---:|---:|---:|"]
        lines += [f"| `{row['op'][-110:]}` | {row['block_bytes']} | {row['count']} | {row['bytes'] / MIB:.1f} |"
                  for row in tr["live_at_peak"]]
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print(out / "summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
