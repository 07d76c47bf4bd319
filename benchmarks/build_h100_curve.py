#!/usr/bin/env python3
"""Derive the GEMM and attention efficiency curves of every hardware profile from measured H100 data.

Input: benchmarks/reference/h100_gemm.json (plain PyTorch bf16 GEMMs of the transformer matmuls on
one H100 SXM, plus fused causal attention and a device copy; see the file's `source`).

H100 (measured):
  * matmul curve: every GEMM row becomes a point (2*m*k*n/1e9 GFLOP, achieved/989.4 TFLOP/s); rows
    are grouped in equal-width bins of log10(GFLOP), each bin gives (median GFLOP, median
    efficiency), and the bin medians are made monotone non-decreasing with weighted isotonic
    regression (pool-adjacent-violators): a bigger GEMM is never predicted slower per FLOP.
  * attention curve: (seq, tflops_causal/989.4) of the sdpa_flash_causal_fwd_bwd rows.
  * hbm_efficiency: device_copy_GBps_read_plus_write / 3350 GB/s (datasheet).

Other GPUs (not measured here): the H100 curve shape is reused with
  * the GFLOP axis scaled by peak_gpu/peak_h100: a GEMM that takes the same time at peak has the
    same fixed-overhead share (launch, tile quantisation, wave tail), and
  * the efficiencies scaled by mamf_gpu/mamf_h100, the ratio of the large-GEMM efficiency ceilings
    measured with one tool (MAMF finder, stas00/ml-engineering, compute/accelerator/README.md,
    "Maximum Achievable Matmul FLOPS comparison table", BF16 rows). Both ceilings come from the same
    table, so the ratio compares like with like even though our own H100 run is a little below
    that table's H100 figure.
The attention curve of other GPUs keeps the H100 sequence axis and is scaled by the same ceiling
ratio (no per-GPU attention measurement was found; an assumption, stated in each profile).

Usage:
  python benchmarks/build_h100_curve.py            # print the TOML snippets and the fit error
  python benchmarks/build_h100_curve.py --write    # also rewrite the generated blocks in hardware_profiles/*.toml
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

# The binning is shared with `parplan calibrate`, which bins its own measurements the same way.
from planner.calibrate import binned_curve, isotonic_increasing  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "benchmarks" / "reference" / "h100_gemm.json"
PROFILES = ROOT / "hardware_profiles"

H100_PEAK_BF16_TFLOPS = 989.4   # H100 SXM datasheet, dense (1979 with 2:4 sparsity)
H100_HBM_GBYTES_PER_S = 3350.0  # H100 SXM datasheet, 3.35 TB/s
N_BINS = 10

# Large-GEMM BF16 efficiency ceilings (MAMF / theory) from stas00/ml-engineering
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table".
# profile name -> (bf16 dense peak TFLOP/s used for the axis scaling, MAMF efficiency, note)
TARGETS = {
    "h100-sxm-80gb": (989.4, 0.803, "MAMF H100 SXM 794.5/989 = 80.3%"),
    "h200-sxm-141gb": (989.4, 0.803, "MAMF table lists H200 as 'the same' as H100 SXM (80.3%)"),
    "a100-sxm-40gb": (312.0, 0.869, "MAMF A100 SXM 271.2/312 = 86.9%"),
    "a100-sxm-80gb": (312.0, 0.869, "MAMF A100 SXM 271.2/312 = 86.9%"),
    "b200": (2250.0, 0.776, "MAMF B200 SXM 1745.0/2250 = 77.6%"),
    "gb200-nvl72": (2450.0, 0.744, "MAMF GB200 SXM 1822.0 TFLOP/s = 74.4% of this profile's 2450 (the table's 72.9% divides by 2500)"),
    "b300": (2250.0, 0.786, "MAMF B300 SXM 1769.0/2250 = 78.6%"),
    "gb300-nvl72": (2450.0, 0.786, "no GB300 row in the MAMF table; B300 SXM's 78.6% (the same Blackwell Ultra GPU)"),
    "l40s": (362.05, 0.743, "no L40S row in the MAMF table; a community run's best square BF16 GEMM, 269.15/362.05 "
                            "= 74.3% (not a shape search)"),
    "a100-pcie-80gb": (312.0, 0.811, "MAMF A100 PCIe 252.9/312 = 81.1% (the row does not say 40 or 80 GB)"),
    "h100-pcie-80gb": (756.0, 0.661, "no H100 PCIe row in the MAMF table; the best square BF16 GEMM of two community "
                                     "runs of one harness, H100 PCIe 495.93 and H800 PCIe (the same GPU) 503.83: "
                                     "499.88/756 = 66.1% (that harness read an H100 SXM at 80.6%, MAMF 80.3%)"),
    # the export-market variants: their twin's silicon (only the NVLink is cut), so their twin's peak and ceiling
    "h800-sxm-80gb": (989.4, 0.803, "the H100 SXM's own curve (the same silicon): MAMF H100 SXM 794.5/989 = 80.3%"),
    "a800-sxm-80gb": (312.0, 0.869, "the A100 SXM's (the same silicon): MAMF A100 SXM 271.2/312 = 86.9%"),
    # the H100 NVL: the H100 PCIe's ceiling, assumed (no NVL row; the one NVL GEMM found sets none)
    "h100-nvl-94gb": (835.5, 0.661, "no H100 NVL row in the MAMF table; ASSUMPTION: the H100 PCIe's 66.1% (both "
                                    "power-capped PCIe cards of the GH100 die)"),
    # the H20: the H100 SXM's silicon with its tensor rate cut, so the H100's ceiling, assumed, at its own peak
    "h20-96gb": (148.0, 0.803, "no H20 row in the MAMF table; ASSUMPTION: the H100 SXM's 80.3% (the same GH100 die)"),
    "gh200-96gb": (989.4, 0.836, "MAMF GH200 SXM 828.6/989 = 83.6% (the table's 900W 141GB HBM3e version)"),
    # the H20-3e: the H20 with the H200's memory, so the H20's (assumed) ceiling at the H20's peak
    "h20-3e-141gb": (148.0, 0.803, "no H20 row in the MAMF table; ASSUMPTION: the H100 SXM's 80.3% (the same GH100 die)"),
    "gh200-144gb": (989.4, 0.836, "MAMF GH200 SXM 828.6/989 = 83.6% (the table's 900W 141GB HBM3e version: this part)"),
    "mi300x": (1307.4, 0.514, "MAMF MI300X 668.4/1300 = 51.4% (ROCm 6.3, TunableOp on)"),
    "mi325x": (1307.4, 0.604, "MAMF MI325X 784.9/1300 = 60.4% (ROCm 6.2.4, TunableOp on, 1000 W)"),
    "mi355x": (2516.6, 0.622, "MAMF MI355X 1565.0 TFLOP/s = 62.2% of 2516.6 (the table's 68.0% divides by 2300)"),
}

BEGIN = "# BEGIN generated by benchmarks/build_h100_curve.py (do not edit by hand)"
END = "# END generated"


def load_reference(path: Path = REFERENCE) -> dict:
    with open(path) as f:
        return json.load(f)


def gemm_points(ref: dict) -> list[tuple[float, float]]:
    """(GFLOP, efficiency) of every measured GEMM row."""
    return [(2.0 * r["m"] * r["k"] * r["n"] / 1e9, r["tflops"] / H100_PEAK_BF16_TFLOPS) for r in ref["gemm_bf16"]]


def interpolate(curve: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear in log(x), clamped at the ends (the contract of HardwareProfile curves)."""
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    raise AssertionError("unreachable")


def fit_errors(curve, points) -> tuple[float, float]:
    """Median and max relative error |predicted/measured - 1| over the measured rows."""
    errs = [abs(interpolate(curve, g) / e - 1.0) for g, e in points]
    return statistics.median(errs), max(errs)


def attention_curve(ref: dict) -> list[tuple[float, float]]:
    rows = sorted(ref["sdpa_flash_causal_fwd_bwd"], key=lambda r: r["seq"])
    return [(float(r["seq"]), r["tflops_causal"] / H100_PEAK_BF16_TFLOPS) for r in rows]


def hbm_efficiency(ref: dict) -> float:
    return ref["device_copy_GBps_read_plus_write"] / H100_HBM_GBYTES_PER_S


def scaled(curve, axis_scale: float, eff_scale: float):
    return [(x * axis_scale, min(1.0, y * eff_scale)) for x, y in curve]


def curves_for(name: str, ref: dict) -> dict:
    """Matmul and attention curves (and H100 fit errors) for one profile."""
    points = gemm_points(ref)
    h100 = binned_curve(points)
    attn = attention_curve(ref)
    peak, mamf, note = TARGETS[name]
    h100_peak, h100_mamf, _ = TARGETS["h100-sxm-80gb"]
    axis = peak / h100_peak
    eff = mamf / h100_mamf
    med, mx = fit_errors(h100, points)
    return {
        "matmul": scaled(h100, axis, eff),
        "attention": scaled(attn, 1.0, eff),
        "axis_scale": axis,
        "eff_scale": eff,
        "note": note,
        "h100_fit_median": med,
        "h100_fit_max": mx,
        "n_rows": len(points),
    }


def _fmt_curve(curve) -> str:
    return "[\n" + "".join(f"  [{x:.6g}, {y:.4f}],\n" for x, y in curve) + "]"


def toml_block(name: str, ref: dict) -> str:
    c = curves_for(name, ref)
    lines = [BEGIN]
    if name == "h100-sxm-80gb":
        lines.append(f"# Measured: {c['n_rows']} bf16 GEMM rows of benchmarks/reference/h100_gemm.json, {N_BINS} log10(GFLOP) bins,")
        lines.append("# bin medians, isotonic (non-decreasing) smoothing. Fit error of this curve on the measured rows")
        lines.append(f"# (|predicted/measured - 1|): median {c['h100_fit_median']:.1%}, max {c['h100_fit_max']:.1%}.")
    else:
        lines.append(f"# H100 measured curve with GFLOP x {c['axis_scale']:.4g} (peak ratio) and efficiency x {c['eff_scale']:.4f}")
        lines.append(f"# (ceiling ratio; {c['note']} vs MAMF H100 SXM 80.3%).")
    lines.append(f"matmul_efficiency_curve = {_fmt_curve(c['matmul'])}")
    if name == "h100-sxm-80gb":
        lines.append("# seq -> tflops_causal/989.4 of the sdpa_flash_causal_fwd_bwd rows (batch*seq = 16k tokens, 32 heads x 128).")
    else:
        lines.append("# H100 measured attention curve scaled by the same ceiling ratio (no per-GPU attention measurement found).")
    lines.append(f"attention_efficiency_curve = {_fmt_curve(c['attention'])}")
    if name == "h100-sxm-80gb":
        lines.append(f"# device_copy_GBps_read_plus_write {ref['device_copy_GBps_read_plus_write']} / 3350 GB/s datasheet")
    else:
        lines.append("# H100 measured copy/datasheet ratio reused (no per-GPU streaming measurement sourced).")
    lines.append(f"hbm_efficiency = {hbm_efficiency(ref):.4f}")
    lines.append(END)
    return "\n".join(lines)


def rewrite_profile(path: Path, block: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no generated block markers found")
    path.write_text(pattern.sub(lambda _m: block, text))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the generated blocks of hardware_profiles/*.toml")
    args = ap.parse_args()
    ref = load_reference()
    c = curves_for("h100-sxm-80gb", ref)
    print(f"H100 curve: {len(c['matmul'])} points from {c['n_rows']} GEMM rows; fit error median {c['h100_fit_median']:.2%}, max {c['h100_fit_max']:.2%}")
    print(f"hbm_efficiency = {hbm_efficiency(ref):.4f}")
    for name in TARGETS:
        block = toml_block(name, ref)
        print(f"\n## {name}\n{block}")
        if args.write:
            rewrite_profile(PROFILES / f"{name}.toml", block)
    if args.write:
        print(f"\nrewrote {len(TARGETS)} profiles under {PROFILES}")


if __name__ == "__main__":
    main()
