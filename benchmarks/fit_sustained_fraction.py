"""Fit the one training-run parameter of the H100 profile: sustained_matmul_fraction.

The H100 matmul and attention curves come from isolated-kernel microbenchmarks
(benchmarks/reference/h100_gemm.json: 10 timed runs after 3 warm-ups).  A long training run
sustains less (clocks under the 700 W power cap, launch gaps between kernels).  This script
scans the fraction on a 0.01 grid and keeps the value with the smallest median absolute error
of predicted MFU against the Megatron-Core H100 2024 table (benchmarks/reference/
megatron_h100_2024.json).  It is the only parameter of any profile fitted to training runs.

    python benchmarks/fit_sustained_fraction.py          # prints the scan and the best value
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hardware_profiles  # noqa: E402
from planner.validate import ADAPTERS, reference_dir, run_query  # noqa: E402


def median_error(fraction: float, queries, base) -> tuple[float, float]:
    prof = base.model_copy(update={"sustained_matmul_fraction": fraction})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{base.name}.json"
        path.write_text(prof.model_dump_json())
        errs = []
        for q in queries:
            plan = run_query(q, hardware_override=str(path))
            errs.append(abs(plan.prediction.mfu - q.published) / q.published)
    return float(np.median(errs)), float(np.max(errs))


def main() -> None:
    data = json.loads((reference_dir() / "megatron_h100_2024.json").read_text())
    queries = list(ADAPTERS["megatron_h100_2024"](data))
    base = hardware_profiles.load_profile("h100-sxm-80gb")
    best = None
    for f in np.round(np.arange(0.60, 1.0001, 0.01), 2):
        med, mx = median_error(float(f), queries, base)
        print(f"sustained_matmul_fraction {f:.2f}: median |error| {med:6.2%}  max {mx:6.2%}")
        if best is None or med < best[1] - 1e-12:
            best = (float(f), med, mx)
    print(f"best: {best[0]:.2f} (median {best[1]:.2%}, max {best[2]:.2%})")


if __name__ == "__main__":
    main()
