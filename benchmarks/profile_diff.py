"""Two profiled steps side by side (`parplan launch --profile`'s rankN.ops.json): where B spends more than A.

    python3 benchmarks/profile_diff.py A/profile/rank0.ops.json B/profile/rank0.ops.json [--top 25] [--out diff.md]

For a run far from its prediction against a twin that is not (2026-12-06's H100: the 1.3B with FP8 linears stepped
in 1,020 ms, its 16-bit twin in 152): the steps' wall time, the GPU's busy time and the host operators' time of
each, then the kernels and the host operators whose time differs most, B minus A, in milliseconds.  Reads the files
only (no torch): runs anywhere the results were copied to.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {path}: {e} -- give a rankN.ops.json that `parplan launch --profile DIR` wrote")
    if not isinstance(data, dict) or "ops" not in data or "wall_s" not in data:
        raise SystemExit(f"error: {path} is not a profiled step's ops.json (no ops / wall_s) -- give the rankN.ops.json "
                         "that `parplan launch --profile DIR` wrote")
    return data


def _by_name(data: dict, kind_kernel: bool) -> dict[str, dict]:
    return {o["name"]: o for o in data["ops"] if (o.get("kind") == "kernel") == kind_kernel}


def differences(a: dict, b: dict, kernels: bool, key: str) -> list[dict]:
    """Each kernel (kernels True, by self device time) or host operator (by self host time) of either step: its
    time and calls in A and B and B - A (microseconds), largest difference first."""
    ra, rb = _by_name(a, kernels), _by_name(b, kernels)
    rows = []
    for name in set(ra) | set(rb):
        ta, tb = (ra.get(name) or {}).get(key, 0.0), (rb.get(name) or {}).get(key, 0.0)
        rows.append({"name": name, "a_us": ta, "b_us": tb, "diff_us": tb - ta,
                     "a_calls": (ra.get(name) or {}).get("calls", 0), "b_calls": (rb.get(name) or {}).get("calls", 0)})
    return sorted(rows, key=lambda r: (-abs(r["diff_us"]), r["name"]))


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f}"


def _sec(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def markdown(a: dict, b: dict, names: tuple[str, str], top: int) -> str:
    lines = [f"# Profiled steps: A = {names[0]}, B = {names[1]}", "",
             "| | A | B | B - A |", "|---|---:|---:|---:|"]
    for label, key in (("step wall ms", "wall_s"), ("GPU busy ms (kernels)", "device_busy_s"),
                       ("host operators' self ms", "host_self_s")):
        va, vb = a.get(key), b.get(key)
        diff = "-" if va is None or vb is None else f"{(vb - va) * 1e3:+.1f}"
        lines.append(f"| {label} | {_sec(va)} | {_sec(vb)} | {diff} |")
    for title, kernels, key in (("Kernels, self device time", True, "self_device_us"),
                                ("Host operators, self host time", False, "self_host_us")):
        rows = [r for r in differences(a, b, kernels, key) if r["diff_us"] != 0][:top]
        if not rows:
            continue
        lines += ["", f"## {title}: the {len(rows)} largest differences", "",
                  "| name | A calls | A ms | B calls | B ms | B - A ms |", "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            name = r["name"].replace("|", "\\|")
            name = name if len(name) <= 100 else name[:97] + "..."
            lines.append(f"| {name} | {r['a_calls']} | {_ms(r['a_us'])} | {r['b_calls']} | {_ms(r['b_us'])} | "
                         f"{r['diff_us'] / 1e3:+.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the reference step's rankN.ops.json")
    ap.add_argument("b", help="the step to explain's rankN.ops.json")
    ap.add_argument("--top", type=int, default=25, help="rows in each table (default 25)")
    ap.add_argument("--out", help="also write the tables here")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top must be 1 or more, got {args.top}")
    text = markdown(load(args.a), load(args.b), (args.a, args.b), args.top)
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
