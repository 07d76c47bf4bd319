"""How steady is the host-dispatch probe, with one pair of runs per mode against HOST_REPEATS pairs?

`parplan calibrate` measures the host time to dispatch one block (planner.calibrate.measure_host_block: the
runtime's step time with 10 blocks minus with 2, over 8).  On the H200 host of 2026-11-28 one pair per mode read
selective below no recompute and op-level selective at 4.7x the H100s' reading, and full recompute 34 % under the
launches' own dispatch: one pair is at the mercy of whatever the host did during it.  Since then each mode runs
HOST_REPEATS pairs and keeps their median.  This script calls the probe `--calls` times each way on this machine
and prints each way's readings and their spread over calls ((max - min) / median): how much a calibrate
run on this host can move.  On a CPU (--device cpu) the runtime computes the blocks on the host, so the numbers
are this CPU's, a check of the estimator only; on a GPU machine, --device cuda measures the real thing.

    python benchmarks/host_probe_repeats.py --device cpu --calls 6 [--out R/host_probe_repeats.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from planner.calibrate import HOST_REPEATS, measure_host_block
    from gpu_accuracy import write_or_print

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--modes", nargs="+", default=["none", "full"])
    ap.add_argument("--out")
    a = ap.parse_args()
    out = [f"# Host-dispatch probe: one pair of runs per mode against {HOST_REPEATS}", "",
           f"`python benchmarks/host_probe_repeats.py --device {a.device} --calls {a.calls}`: {a.calls} calls of "
           "measure_host_block each way, in turn; ms per block.", "",
           "| pairs per mode | mode | readings (ms) | median | spread over calls |", "|---|---|---|---|---|"]
    got: dict[int, dict[str, list[float]]] = {1: {m: [] for m in a.modes}, HOST_REPEATS: {m: [] for m in a.modes}}
    for _ in range(a.calls):
        for reps in got:  # alternate, so both ways see the same drift of the machine
            for m, v in measure_host_block(a.device, modes=tuple(a.modes), repeats=reps).items():
                got[reps][m].append(v * 1e3)
    for reps, by_mode in got.items():
        for m, v in by_mode.items():
            med = statistics.median(v)
            out.append(f"| {reps} | {m} | {' '.join(f'{x:.2f}' for x in v)} | {med:.2f} | {(max(v) - min(v)) / med:.1%} |")
    write_or_print("\n".join(out) + "\n", a.out)


if __name__ == "__main__":
    main()
