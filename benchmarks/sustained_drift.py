"""Does a long run slow down as the GPU settles under its power and thermal limits?

The profiles' sustained_matmul_fraction scales every GEMM below its isolated-kernel rate.  The shipped H100 value
(0.83) is fitted to Megatron's multi-GPU table, and this project's calibrated curves fit that table at 0.84-0.86
too (benchmarks/sustained_gap.py), but parplan's own single-GPU launches, 10 steps of a few seconds each, match the
calibrated curves at about 1.0.  One physical reading of the gap: a short run keeps the boost clock, a long one
settles at the clock the power and thermal limits allow.  A device call measures it two ways (the device scripts):

  calibrate --sustained S   the best GEMM back to back for S seconds (planner.calibrate.measure_sustained): steady
                            over isolated throughput, written as the profile's sustained_matmul_fraction
  long/                     one GPU-bound launch (llama-3b-mbs4-none) for ~200 steps with nvidia-smi reading the SM
                            clock, power and temperature every second (gpu_call_start.sh long_run)

This script (CPU) reads a results folder and prints, for each long run: the step time of the first steps after
warm-up against the last third, the clock, power and temperature at the start and at the end, and the prediction
under the folder's calibrated profile (whose sustained fraction calibrate --sustained measured, if it ran).  A long
run with fewer than 2 x FIRST timed steps (or an unreadable report) is left out, with a note on stderr and a line on
the page; a folder that is missing or holds no long run that can be tabulated is an error (exit 2), not an empty table.

    python benchmarks/sustained_drift.py benchmarks/results/2026-12-01-h200 [--out R/sustained.md]
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIRST = 10  # steps after warm-up that make the "first" window


class DriftError(ValueError):
    """Nothing to tabulate (no such folder, no long run in it, or none long enough); the message is one line."""


def drift(steps: list[dict], warmup: int) -> dict:
    """Median step time of the first FIRST steps after warm-up and of the last third, and when (seconds into the
    timed steps) each window starts."""
    after = [s["step_time_s"] for s in steps[warmup:]]
    if len(after) < 2 * FIRST:
        raise ValueError(f"{len(after)} timed steps: a drift needs at least {2 * FIRST}")
    last_from = len(after) - len(after) // 3
    first = statistics.median(after[:FIRST])
    last = statistics.median(after[last_from:])
    fifths = [statistics.median(after[i * len(after) // 5:(i + 1) * len(after) // 5]) for i in range(5)]
    return {"steps": len(after), "first_s": first, "last_s": last, "slowdown": last / first - 1.0,
            "last_starts_s": sum(after[:last_from]), "run_s": sum(after), "fifths_s": fifths}


def smi_trace(path: Path) -> dict | None:
    """SM clock, power and temperature at the start of the load and over the last third of it, from nvidia-smi's
    csv (timestamp, clocks.sm [MHz], power.draw [W], temperature.gpu); the load is the samples above half the
    largest power read."""
    if not path.exists():
        return None
    rows = []
    with open(path) as f:
        for r in csv.reader(f):
            try:
                rows.append(tuple(float(v) for v in r[1:4]))
            except (ValueError, IndexError):
                continue
    if not rows:
        return None
    top = max(p for _, p, _ in rows)
    load = [r for r in rows if r[1] > 0.5 * top]
    last = load[len(load) - max(1, len(load) // 3):]
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    fifths = [load[k * len(load) // 5:(k + 1) * len(load) // 5] or load for k in range(5)]
    return {"samples": len(load), "first": load[0], "last": tuple(med(last, i) for i in range(3)),
            "fifths": [tuple(med(f, i) for i in range(3)) for f in fifths]}


def step_telemetry(steps: list[dict], warmup: int) -> dict | None:
    """(SM MHz, W, C) of the first FIRST timed steps and of the last third, from the report's own per-step clocks
    (parallel_layers.telemetry, launches since 2026-11-28), or None when its steps have none."""
    after = [s for s in steps[warmup:] if s.get("sm_mhz") is not None]
    if len(after) < 2 * FIRST:
        return None
    from parallel_layers.telemetry import FIELDS
    first, last = after[:FIRST], after[len(after) - len(after) // 3:]
    return {"first": tuple(statistics.median(s[k] for s in first) for k in FIELDS),
            "last": tuple(statistics.median(s[k] for s in last) for k in FIELDS)}


def predicted_step(plan: dict, profile: Path) -> float:
    from gpu_accuracy import predict
    from planner.schema import Plan
    return predict(Plan(**plan), str(profile))[0]


def long_reports(root: Path) -> list[Path]:
    """The long runs' reports under `root`/long; DriftError (one line) where the folder or the runs are missing,
    so that a mistyped folder does not print an empty table."""
    if not root.is_dir():
        raise DriftError(f"{root} is not a folder: give a device call's results folder (benchmarks/results/<date>-<gpu>)")
    reports = sorted((root / "long").glob("*/report.json"))
    if not reports:
        raise DriftError(f"no long runs in {root}: no {root / 'long'}/*/report.json (the device scripts' long_run writes "
                         "them)")
    return reports


def build(root: Path, notes: list[str] | None = None) -> list[str]:
    """The page's lines.  A long run that cannot be tabulated (fewer than 2 x FIRST timed steps, or a report that
    cannot be read) is left out with a one-line note, appended to `notes` and listed on the page; DriftError when no
    run is left."""
    from hardware_profiles import load_profile

    reports = long_reports(root)
    notes = [] if notes is None else notes

    profiles = sorted(root.glob("*-calibrated.toml"))
    prof = profiles[0] if profiles else None
    out = [f"# Long runs against short ones ({root.name})", "",
           "Generated by `python benchmarks/sustained_drift.py " + str(root) + "`: step times of each long launch "
           f"under {root.name}/long (first {FIRST} steps after warm-up against the last third), the SM clock, power and "
           "temperature over the same steps (the report's own per-step readings; else nvidia-smi's csv: the start "
           "of the load against its last third), and the step time "
           "predicted with " + (f"`{prof.name}`" if prof else "no calibrated profile") + ".", ""]
    if prof:
        p = load_profile(str(prof))
        how = next((s for s in p.sources if "sustained:" in s), None)
        out += [f"Profile sustained_matmul_fraction: {p.sustained_matmul_fraction:g} "
                + ("(measured by calibrate --sustained: " + how.split("sustained:", 1)[1].strip() + ")" if how
                   else "(kept from the base profile; calibrate ran without --sustained)"), ""]
    out += ["| run | timed steps | run s | first ms | last third ms (from s) | slowdown | SM MHz first -> last | "
            "W first -> last | C first -> last | predicted ms | err vs first | err vs last |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    smi = smi_trace(root / "long" / "nvidia-smi.csv")
    trajectory: list[str] = []
    skipped: list[str] = []
    for rep_path in reports:
        try:
            rep = json.loads(rep_path.read_text())
            d = drift(rep["steps"], rep["warmup_steps"])
            pred = predicted_step(rep["plan"], prof) if prof else None
        except json.JSONDecodeError as e:
            why = f"not valid JSON ({e})"
        except ValueError as e:  # drift(): too few timed steps; a plan the cost model refuses (PlannerError, pydantic's)
            why = str(e)
        except KeyError as e:
            why = f"the report has no {e}"
        except (OSError, TypeError) as e:
            why = f"{e.__class__.__name__}: {e}"
        else:
            why = None
        if why is not None:
            why = " ".join(why.split())
            skipped.append(f"{rep_path.parent.name}: skipped ({why})")
            notes.append(f"note: {rep_path}: skipped, {why}")
            continue
        own = step_telemetry(rep["steps"], rep["warmup_steps"])  # the run's own per-step clocks, where it has them
        ends = own or smi
        tel = (f"{ends['first'][0]:.0f} -> {ends['last'][0]:.0f} | {ends['first'][1]:.0f} -> {ends['last'][1]:.0f} | "
               f"{ends['first'][2]:.0f} -> {ends['last'][2]:.0f}") if ends else "- | - | -"
        errs = (f"{pred * 1e3:.1f} | {pred / d['first_s'] - 1:+.1%} | {pred / d['last_s'] - 1:+.1%}") if pred else "- | - | -"
        out.append(f"| {rep_path.parent.name} | {d['steps']} | {d['run_s']:.0f} | {d['first_s'] * 1e3:.1f} | "
                   f"{d['last_s'] * 1e3:.1f} ({d['last_starts_s']:.0f}) | {d['slowdown']:+.1%} | {tel} | {errs} |")
        trajectory.append(f"- {rep_path.parent.name}: step ms by fifth of the timed steps "
                          + " / ".join(f"{x * 1e3:.1f}" for x in d["fifths_s"]))
    if len(skipped) == len(reports):
        raise DriftError(f"no long run in {root / 'long'} can be tabulated: " + "; ".join(skipped))
    trajectory += [f"- {s}" for s in skipped]
    if smi:
        trajectory.append("- nvidia-smi by fifth of the load (SM MHz, W, C): "
                          + " / ".join(f"{c:.0f}, {p:.0f}, {t:.0f}" for c, p, t in smi["fifths"]))
    return out + ([""] + trajectory if trajectory else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="a device call's results folder (with long/)")
    ap.add_argument("--out", help="write the markdown here (default: print)")
    a = ap.parse_args(argv)
    from gpu_accuracy import write_or_print
    notes: list[str] = []
    try:
        text = "\n".join(build(Path(a.root), notes)) + "\n"
    except DriftError as e:  # its message names every run it skipped
        print(f"error: {e}", file=sys.stderr)
        return 2
    for n in notes:
        print(n, file=sys.stderr)
    write_or_print(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
