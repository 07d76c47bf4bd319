"""The pipeline bubble of torch's own schedule orders, against cost_models.total.bubble_factor.

    python benchmarks/schedule_bubble.py [--out DIR]     (prints the tables; --out: DIR/results.json)

The cost model predicts a pipeline step as (M + bubble_factor) x t_mb, with t_mb = v (f + b + w) the
time of one micro-batch through one rank's v chunks.  Here the order each rank runs comes from torch
itself (the classes parplan's runtime maps schedule names to, parallel_layers.pipeline.SCHEDULES):
  - interleaved-1f1b, interleaved-zb, zbv: the lowered order the runtime executes
    (pipeline_order_with_comms, via torch's _schedule_visualizer.get_schedule_ops with mock stages),
    compute actions only;
  - gpipe, 1f1b: these run their own loop (_step_microbatches), not an order; it is run on a mock
    stage per rank and the forward_one_chunk / backward_one_chunk calls are recorded.  (Their
    pipeline_order attribute is for drawing only, and 1F1B's is wrong on the last rank: torch 2.13
    lists F1..FM there instead of F0..FM-1.)
That order is then timed as a dependency graph with zero communication time: each rank runs its
actions in order, each as soon as the rank is free and its inputs are done (F of stage s needs F of
s-1; an input-gradient backward I, or a full backward B, of stage s needs its own F and the input
gradient of s+1; W needs its own I), costing F = f, I = b, W = w, B = b + w per chunk.  The step's
makespan T is what one step costs when every step ends in a pipeline-wide sync (parplan's gradient
clipping all-reduces the norm over pp); the simulated bubble factor is T / t_mb - M.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import date
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops  # noqa: E402
from torch.distributed.pipelining.stage import PipelineStage  # noqa: E402

from cost_models.layout import SCHEDULES as CODES, Layout, stages_of_rank  # noqa: E402
from cost_models.total import bubble_factor  # noqa: E402
from parallel_layers.pipeline import SCHEDULES, SINGLE_STAGE  # noqa: E402

KINDS = ("F", "I", "W", "B")  # the values of torch's compute _ComputationTypes (B: full backward)
# (f, b, w) per chunk.  "llama-8k" and "llama-32k": the cost model's own split of a llama3-8b block (tp 1,
# micro-batch 1, flash attention, H100 profile) at 8,192 and 32,768 tokens, forward = 1: the input-gradient
# pass carries the attention's backward, the weight-gradient pass only GEMMs (cost_models.compute.block_time)
COSTS = {"even": (1.0, 1.0, 1.0), "b1.2-w0.8": (1.0, 1.2, 0.8), "llama-8k": (1.0, 1.29, 0.78),
         "llama-32k": (1.0, 1.68, 0.53)}


def _single_stage_order(cls, p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Run ScheduleGPipe / Schedule1F1B's own _step_microbatches on a mock stage per rank and
    record the order of its forward and (full) backward calls."""
    order = []
    for r in range(p):
        acts: list[tuple[str, int, int]] = []
        st = mock.create_autospec(PipelineStage, instance=True)
        st.stage_index, st.num_stages, st.group_rank, st.group_size = r, p, r, p
        st.is_first, st.is_last, st.submod = r == 0, r == p - 1, None
        for name in ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
            getattr(st, name).return_value = []
        st.forward_one_chunk.side_effect = lambda i, *a, _r=r, _acts=acts, **k: _acts.append(("F", _r, i))
        st.backward_one_chunk.side_effect = lambda i, *a, _r=r, _acts=acts, **k: _acts.append(("B", _r, i))
        sch = cls(st, m)
        with mock.patch.multiple(sch, _initialize_stage=mock.DEFAULT, _maybe_compute_loss=mock.DEFAULT,
                                 _maybe_get_loss=mock.DEFAULT, _update_losses=mock.DEFAULT):
            sch._step_microbatches()
        order.append(acts)
    return order


def torch_order(schedule: str, p: int, v: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per rank, the (kind, stage, micro-batch) compute actions torch runs, kind in F, I, W, B (B =
    full backward).  Raises torch's ValueError where torch refuses (m, p, v)."""
    cls = SCHEDULES[schedule]
    if schedule in SINGLE_STAGE:
        return _single_stage_order(cls, p, m)
    ops = get_schedule_ops(cls, p, m, v, with_comms=True)
    return [[(a.computation_type.value, a.stage_index, a.microbatch_index) for a in rank
             if a is not None and a.computation_type.value in KINDS] for rank in ops]


def simulate(order, f: float, b: float, w: float) -> float:
    """Makespan of per-rank action orders under list scheduling with zero communication time."""
    n = 1 + max(s for acts in order for _, s, _ in acts)
    cost = {"F": f, "I": b, "W": w, "B": b + w}
    done: dict[tuple[str, int, int], float] = {}  # ("F"|"I"|"W", stage, mb) -> finish time
    pos, free = [0] * len(order), [0.0] * len(order)
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(order):
            while pos[r] < len(acts):
                kind, s, i = acts[pos[r]]
                if kind == "F":
                    deps = [("F", s - 1, i)] if s > 0 else []
                elif kind == "W":
                    deps = [("I", s, i)]
                else:  # I or B: own forward, and the input gradient from the next stage
                    deps = [("F", s, i)] + ([("I", s + 1, i)] if s < n - 1 else [])
                if any(d not in done for d in deps):
                    break
                free[r] = max([free[r]] + [done[d] for d in deps]) + cost[kind]
                for k in (("I", "W") if kind == "B" else (kind,)):
                    done[(k, s, i)] = free[r]
                pos[r] += 1
                progress = True
    stuck = [acts[pos[r]] for r, acts in enumerate(order) if pos[r] < len(acts)]
    if stuck:
        raise RuntimeError(f"order deadlocks; ranks wait at {stuck}")
    return max(free)


def sim_bubble(order, v: int, m: int, f: float, b: float, w: float) -> float:
    """Simulated bubble factor T / t_mb - M, t_mb = v (f + b + w)."""
    return simulate(order, f, b, w) / (v * (f + b + w)) - m


def model_bubble(schedule: str, p: int, v: int, m: int, costs=None) -> float:
    """cost_models.total.bubble_factor for a layout with this schedule, pp = p, vpp = v (costs: (f, b, w);
    default f = b = w)."""
    lay = Layout(gpus=p, tp=1, pp=p, dp=1, cp=1, vpp=v, mbs=1, zero=0, recompute=0, sp=0,
                 schedule=CODES.index(schedule), offload=0)
    return float(bubble_factor(lay, m, costs))


def grid():
    """(schedule, p, v, M): p in 2, 4, 8; v 1 for the single-stage schedules, 2 and 4 interleaved, 2
    for zbv; M = 1 .. 4p."""
    for schedule in SCHEDULES:
        vs = [1] if schedule in SINGLE_STAGE else [2] if schedule == "zbv" else [2, 4]
        for p in (2, 4, 8):
            for v in vs:
                for m in range(1, 4 * p + 1):
                    yield schedule, p, v, m


def run_case(schedule: str, p: int, v: int, m: int) -> dict:
    """One grid point: torch's refusal, or the simulated bubble per cost set beside the model's."""
    row = {"schedule": schedule, "p": p, "v": v, "M": m}
    try:
        order = torch_order(schedule, p, v, m)
    except ValueError as e:
        return row | {"refused": str(e).split("\n")[0]}
    for r, acts in enumerate(order):  # torch places stages where parplan's runtime builds them
        assert {s for _, s, _ in acts} == set(stages_of_rank(r, p, v, schedule)), (schedule, p, v, r)
    for name, (f, b, w) in COSTS.items():
        row[name] = round(sim_bubble(order, v, m, f, b, w), 6)
        row["model " + name] = round(model_bubble(schedule, p, v, m, (f, b, w)), 6)
    return row


def _ranges(ms: list[int]) -> str:
    """1, 2, 3, 5, 7, 8 -> '1-3, 5, 7-8'."""
    runs: list[list[int]] = []
    for m in ms:
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def summary_md(rows: list[dict]) -> str:
    """A table per schedule: per (p, v), the M with the same simulated and model bubble factors (every cost
    set) on one line, each cost set as simulated / model; the M torch refuses on another."""
    names = list(COSTS)
    out = []
    for schedule in SCHEDULES:
        out += [f"\n### {schedule}\n",
                "| p | v | M | " + " | ".join(f"{n} (f, b, w = {', '.join(f'{x:g}' for x in COSTS[n])}): simulated / model"
                                           for n in names) + " | largest miss |",
                "|---|---|---|" + "---|" * (len(names) + 1)]
        cases = sorted({(r["p"], r["v"]) for r in rows if r["schedule"] == schedule})
        for p, v in cases:
            mine = [r for r in rows if (r["schedule"], r["p"], r["v"]) == (schedule, p, v)]
            groups: dict[tuple, list[int]] = {}
            for r in mine:
                if "refused" not in r:
                    groups.setdefault(tuple((r[n], r["model " + n]) for n in names), []).append(r["M"])
            for pairs, ms in groups.items():
                miss = max(abs(sim - model) for sim, model in pairs)
                cells = " | ".join(f"{sim:.4g} / {model:.4g}" for sim, model in pairs)
                out.append(f"| {p} | {v} | {_ranges(ms)} | {cells} | {'0' if miss < 1e-9 else f'{miss:.3g}'} |")
            refused = [r["M"] for r in mine if "refused" in r]
            if refused:
                out.append(f"| {p} | {v} | {_ranges(refused)} | torch refuses |" + " |" * len(names))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for results.json")
    args = ap.parse_args()
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)
    rows = [run_case(*case) for case in grid()]
    tables = summary_md(rows)
    print(tables)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"date": date.today().isoformat(), "torch": torch.__version__, "costs_f_b_w": COSTS,
                "bubble": "T / (v (f + b + w)) - M, T the zero-communication makespan of torch's order"}
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
