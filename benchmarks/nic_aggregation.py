"""Score every published set with and without NIC aggregation across nodes (the profiles' inter_node.aggregate_nics).

By default the cost model charges a collective across nodes one NIC's bandwidth per rank.  NCCL can do better on
NVLink nodes with a NIC per GPU: each channel's ring leaves the node through a different NIC (NVIDIA/nccl#412), so
a group with k ranks on a node moves at k NICs' bandwidth, up to the node's fabric (192 GB/s all-reduce bus
bandwidth on a DGX A100 with 8 x 200 Gb/s, NVIDIA/nccl#812).  Which of the two the published runs saw decides the
default; this script predicts every run of every set both ways (each run's own profile, copied with
aggregate_nics on) and, with --fit, scans the two fitted sustained fractions again with it on.

    python benchmarks/nic_aggregation.py --out benchmarks/results/nic_aggregation.md [--fit]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hardware_profiles  # noqa: E402
from planner.validate import ADAPTERS, available_sets, metric_value, reference_dir, run_query  # noqa: E402


def aggregated(profile):
    return profile.model_copy(update={"inter_node": profile.inter_node.model_copy(update={"aggregate_nics": True})})


def score(queries, tmp: Path):
    """(label, metric, published, error default, error aggregated) per run."""
    paths = {}
    rows = []
    for q in queries:
        if q.hardware not in paths:
            prof = aggregated(hardware_profiles.load_profile(q.hardware))
            paths[q.hardware] = tmp / f"{prof.name}.json"
            paths[q.hardware].write_text(prof.model_dump_json())
        a, b = run_query(q), run_query(q, hardware_override=str(paths[q.hardware]))
        err = [None if p is None else (metric_value(p, q) - q.published) / q.published for p in (a, b)]
        rows.append((q.label, q.metric, q.published, err[0], err[1]))
    return rows


def fit_scan(name: str, set_name: str, tmp: Path):
    """Median |error| of the fit set over a 0.01 grid of the sustained fraction, NIC aggregation on."""
    data = json.loads((reference_dir() / f"{set_name}.json").read_text())
    queries = list(ADAPTERS[set_name](data))
    base = aggregated(hardware_profiles.load_profile(name))
    out = []
    for f in np.round(np.arange(0.70, 1.0001, 0.01), 2):
        prof = base.model_copy(update={"sustained_matmul_fraction": float(f)})
        path = tmp / f"{name}.json"
        path.write_text(prof.model_dump_json())
        errs = [abs(metric_value(p, q) - q.published) / q.published
                for q in queries if (p := run_query(q, hardware_override=str(path))) is not None]
        out.append((float(f), float(np.median(errs)), float(np.max(errs))))
    return out


def _pct(x):
    return "-" if x is None else f"{x * 100:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the report here (markdown) as well as printing it")
    ap.add_argument("--fit", action="store_true", help="also scan the fitted sustained fractions with aggregation on")
    args = ap.parse_args()
    lines = ["# NIC aggregation across nodes: every published set both ways",
             "",
             f"Generated {datetime.date.today()} by `python benchmarks/nic_aggregation.py{' --fit' if args.fit else ''}`. "
             "Default: a collective across nodes at one NIC's bandwidth per rank (the shipped profiles). Aggregated: "
             "each run's profile with `[inter_node] aggregate_nics = true` (a group with k ranks on a node at k NICs' "
             "bandwidth, up to NVLink). Same cases as `parplan validate`; error = (predicted - published) / published.",
             "",
             "| set | runs | median default | max default | median aggregated | max aggregated |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    moved = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in available_sets():
            data = json.loads((reference_dir() / f"{name}.json").read_text())
            rows = score(list(ADAPTERS[name](data)), tmp)
            e0 = [abs(r[3]) for r in rows if r[3] is not None]
            e1 = [abs(r[4]) for r in rows if r[4] is not None]
            lines.append(f"| {name} | {len(rows)} | {np.median(e0):.1%} | {max(e0):.1%} | {np.median(e1):.1%} | "
                         f"{max(e1):.1%} |")
            moved += [(name,) + r for r in rows
                      if r[3] is not None and r[4] is not None and abs(r[4] - r[3]) >= 0.01]
        lines += ["", "## Runs that move by a point or more", "",
                  "| set | run | metric | published | error default | error aggregated |",
                  "| --- | --- | --- | ---: | ---: | ---: |"]
        lines += [f"| {s} | {lab} | {met} | {pub:g} | {_pct(a)} | {_pct(b)} |" for s, lab, met, pub, a, b in moved]
        if args.fit:
            lines += ["", "## The fitted sustained fractions, scanned with aggregation on", ""]
            for prof, set_name in (("h100-sxm-80gb", "megatron_h100_2024"), ("a100-sxm-80gb", "megatron_sc21_table1")):
                scan = fit_scan(prof, set_name, tmp)
                best = min(scan, key=lambda r: r[1])
                shipped = hardware_profiles.load_profile(prof).sustained_matmul_fraction
                at = next(r for r in scan if abs(r[0] - shipped) < 1e-9)
                lines.append(f"- {prof} on {set_name}: best {best[0]:.2f} (median {best[1]:.2%}, max {best[2]:.2%}); "
                             f"at the shipped {shipped:.2f}: median {at[1]:.2%}, max {at[2]:.2%}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
