"""Several plans in one process: ``python -m parallel_layers.probe --plan A.json --report A.out.json
--plan B.json --report B.out.json --steps N --device cuda [--compile]`` trains each plan in turn after
one torch import and one process-group start.  It is the host-dispatch probe of `parplan calibrate`
(planner.calibrate.measure_host_block's tiny runs, three pairs per recompute mode: one start-up, and one set of
compiled block graphs shared by the runs of a mode, instead of one each).  One rank; each report is the one `parallel_layers.train` would write."""
from __future__ import annotations

import argparse
import sys

from .train import RunOptions, run_plans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parallel_layers.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", required=True, help="plan JSON (repeatable)")
    ap.add_argument("--report", action="append", required=True, help="report path, one per --plan")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    ap.add_argument("--moe-balanced-routing", action="store_true",
                    help="a mixture of experts' tokens spread evenly over its experts (the calibrate's MoE probe)")
    a = ap.parse_args(argv)
    if len(a.plan) != len(a.report):
        ap.error("give one --report per --plan")
    # no nvidia-smi sampler beside these runs: they measure the host's own dispatch time
    opts = RunOptions(steps=a.steps, device=a.device, compile=a.compile, telemetry=False,
                      moe_balanced_routing=a.moe_balanced_routing)
    run_plans(a.device, [(plan, opts, report) for plan, report in zip(a.plan, a.report)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
