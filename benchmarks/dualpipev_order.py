"""torch's DualPipeV order against ZB-V's, run as parplan's runtime would run it (no overlap callback): why parplan
does not plan DualPipeV.

    python benchmarks/dualpipev_order.py [--out DIR]     (prints the table; --out: DIR/dualpipev.md)

ScheduleDualPipeV (torch 2.13; DeepSeek-V3 report sec. 3.2.1, "cut in half" as in DeepSeek's DualPipe repository)
places two chunks a rank in ZB-V's V and pairs a forward of one chunk with a full backward of the other
(OVERLAP_F_B).  Its gain is that pairing: a callback registered for OVERLAP_F_B (torchtitan's, for expert
parallelism) runs the two passes' compute and all-to-alls interleaved.  Without one, torch's runtime runs a pair's
sub-actions one after the other (_PipelineScheduleRuntime), which is what parplan's runtime would do.  Here each
order comes from torch (get_schedule_ops, pairs expanded in order) and is timed with benchmarks/schedule_bubble.py's
simulator (zero communication; F = f, I = b, W = w, B = b + w a chunk), and the activations a rank holds are counted
along it (a forward adds a chunk-micro-batch, its full backward or weight pass frees it).
"""
from __future__ import annotations

import argparse
import logging
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops  # noqa: E402
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, ScheduleZBVZeroBubble  # noqa: E402

from benchmarks.schedule_bubble import COSTS, KINDS, sim_bubble  # noqa: E402

ORDERS = {"dualpipev": ScheduleDualPipeV, "zbv": ScheduleZBVZeroBubble}


def order(cls, p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per rank, the (kind, stage, micro-batch) compute actions torch lowers cls to, OVERLAP_F_B's sub-actions in
    the order torch's runtime runs them without a callback."""
    out = []
    for rank in get_schedule_ops(cls, p, m, 2, with_comms=True):
        acts = []
        for a in rank:
            if a is None:
                continue
            subs = a.sub_actions if a.computation_type.value == "OVERLAP_F_B" else (a,)
            acts += [(s.computation_type.value, s.stage_index, s.microbatch_index) for s in subs
                     if s.computation_type.value in KINDS]
        out.append(acts)
    return out


def held_peak(acts) -> int:
    """The most chunk-micro-batches a rank holds activations of along its order."""
    held = most = 0
    for kind, _, _ in acts:
        held += (kind == "F") - (kind in ("B", "W"))
        most = max(most, held)
    return most


def rows(ps=(2, 4, 8)):
    for p in ps:
        for m in (2 * p, 4 * p):  # ScheduleDualPipeV asks for at least 2p micro-batches
            orders = {name: order(cls, p, m) for name, cls in ORDERS.items()}
            row = {"p": p, "M": m}
            for name, o in orders.items():
                row[f"{name} held"] = max(held_peak(a) for a in o)
                for label, (f, b, w) in COSTS.items():
                    row[f"{name} {label}"] = sim_bubble(o, 2, m, f, b, w)
            yield row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    a = ap.parse_args()
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.ERROR)
    head = ["p", "M"] + [f"{n} {c}" for c in COSTS for n in ORDERS] + [f"{n} held" for n in ORDERS]
    lines = [f"# DualPipeV against ZB-V, torch's orders without an overlap callback ({date.today()})", "",
             "`python benchmarks/dualpipev_order.py`: the simulated bubble factor (idle time in units of one "
             "micro-batch through a rank's two chunks, zero communication) for each cost set (f, b, w a chunk: "
             + ", ".join(f"{k} {v}" for k, v in COSTS.items()) + "), and the most chunk-micro-batches of "
             "activations a rank holds.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows():
        lines.append("| " + " | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in head) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "dualpipev.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
