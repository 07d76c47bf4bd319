"""Predicted against measured for every committed single-GPU launch report, per hardware profile.

The measured numbers are the reports' own (median step time after warm-up, largest reserved and
allocated peak over ranks), written by `parplan launch` on the GPU; nothing here runs a GPU.  The
predictions are re-made from each report's plan with the cost model of this checkout, under:

  datasheet   hardware_profiles/h100-sxm-80gb.toml (sustained fraction 0.83, fitted to Megatron's H100 table; host
              dispatch per block copied from this calibration)
  calibrated  <dir>/h100-calibrated.toml: `parplan calibrate` on the GPU (curves, HBM, host link,
              host dispatch per block); sustained fraction kept from the datasheet profile
  refit       calibrated + `parplan calibrate --from-run` over the first grid's 16 reports (sustained
              fraction on the compute-bound ones, host dispatch per block on the launch-bound ones),
              redone with this checkout's model -- in-sample for those 16 runs
              (<dir>/h100-refit.toml is this fit as `parplan calibrate --from-run` writes it; the grid-refit
              re-runs were launched with the day's first fit, sustained 0.88, made before the model
              counted the gradient passes -- see the git history of that file)
  held-out    the same refit redone 16 times, each time without the configuration predicted (for the
              later grids' runs: without that configuration's first-grid report)
  refit-s3    calibrated + `calibrate --from-run` over the third session's 17 reports, which carry
              step phases, so the optimizer step is fitted on its own phase first
              (optimizer_bandwidth_fraction, optimizer_host_per_tensor_s), then the rest -- in-sample
              for those 17, out of sample for the 22 earlier runs (<dir>/h100-refit-phases.toml)

Grids: grid (first device session), grid-refit (second), grid-phases and grid-phases-2 (a third
session on another host, launched with <dir>/h100-refit.toml; their reports also carry each step's
host-dispatch / forward-backward / after-backward phases).  The third session's 17 runs are new
measurements: no profile here was fitted to them.

    python3 benchmarks/gpu_accuracy.py benchmarks/results/2026-11-22-h100 [--out accuracy.md]
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibrate import calibrate_from_runs  # noqa: E402
from planner.core import evaluate_plan  # noqa: E402
from planner.schema import Plan  # noqa: E402

GRIDS = ("grid", "grid-refit", "grid-phases", "grid-phases-2")
NEW_RUNS = ("grid-phases", "grid-phases-2")  # measured after every fit used here
FIRST = Path(__file__).resolve().parent / "results" / "2026-11-22-h100"
LATER = tuple(Path(__file__).resolve().parent / "results" / d  # sessions with a grids.json
              for d in ("2026-11-23-h100", "2026-12-06-h100"))
H200 = tuple(Path(__file__).resolve().parent / "results" / d  # the H200 sessions (grids.json)
             for d in ("2026-11-28-h200", "2026-12-04-h200"))
STEP_BAR, MEM_BAR = 0.15, 0.10  # issue 3/4: step time within 15 %, peak memory within 10 %


def measured(rep: dict) -> dict:
    after = rep["steps"][rep["warmup_steps"]:]
    peaks = rep["peak_memory_bytes"]
    peaks = list(peaks.values()) if isinstance(peaks, dict) else peaks
    clocks = [s["sm_mhz"] for s in after if s.get("sm_mhz") is not None]  # reports since 2026-11-28 (telemetry)
    return {"step_s": statistics.median(s["step_time_s"] for s in after),
            "reserved": max(p["reserved"] for p in peaks), "allocated": max(p["allocated"] for p in peaks),
            "sm_mhz": statistics.median(clocks) if clocks else None}


def prediction(plan: Plan, profile: str):
    """The plan's prediction under another profile (a name or a file)."""
    hw = plan.hardware.model_copy(update={"name": profile})
    return evaluate_plan(plan.model_copy(update={"hardware": hw})).prediction


def predict(plan: Plan, profile: str):
    pr = prediction(plan, profile)
    return pr.step_time_s, pr.memory_bytes_per_gpu.total


def predicted_phases(plan: Plan, profile: str) -> tuple[float, float]:
    """(forward/backward, after-backward) seconds the model gives a one-rank plan.  The after phase is
    the optimizer step alone: its passes (what halving the bandwidth fraction adds) plus its per-tensor
    host time (what zeroing it removes); the model reports the gradient upcast with the optimizer, but
    the runtime runs that inside the backward, so it stays in the forward/backward here."""
    from hardware_profiles import load_profile

    prof = load_profile(profile)

    def opt(**update):
        return evaluate_plan(plan, profile=prof.model_copy(update=update)).prediction

    full = opt()
    t = full.time_breakdown.optimizer_s
    passes = opt(optimizer_bandwidth_fraction=prof.optimizer_bandwidth_fraction / 2).time_breakdown.optimizer_s - t
    host = t - opt(optimizer_host_per_tensor_s=0.0).time_breakdown.optimizer_s
    return full.step_time_s - passes - host, passes + host


def phase_table(rs: list[dict], profile: str, label: str) -> list[str]:
    """Measured step phases (reports that carry them) against the model's split of the same step."""
    out = ["", f"Step phases (reports that carry them; medians after warm-up) against the model's split, {label}:", "",
           "| grid | run | fwd+bwd meas ms | pred ms | err | after-backward meas ms | pred ms | err | host done ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        rep = json.loads(Path(r["path"]).read_text())
        after = [s.get("after_s") for s in rep["steps"][rep["warmup_steps"]:]]
        fb = [s.get("fwd_bwd_s") for s in rep["steps"][rep["warmup_steps"]:]]
        host = [s.get("host_dispatch_s") for s in rep["steps"][rep["warmup_steps"]:]]
        if not after or None in after or None in fb:
            continue
        p_fb, p_after = predicted_phases(r["plan"], profile)
        m_fb, m_after = statistics.median(fb), statistics.median(after)
        out.append(f"| {r['grid']} | {r['name']} | {m_fb * 1e3:.1f} | {p_fb * 1e3:.1f} | {rel(p_fb, m_fb):+.1%} | "
                   f"{m_after * 1e3:.1f} | {p_after * 1e3:.1f} | {rel(p_after, m_after):+.1%} | "
                   f"{statistics.median(host) * 1e3:.1f} |")
    return out


def runs(root: Path) -> list[dict]:
    out = []
    for grid in GRIDS:
        for rep_path in sorted((root / grid).glob("*/report.json")):
            rep = json.loads(rep_path.read_text())
            out.append({"grid": grid, "name": rep_path.parent.name, "path": str(rep_path), "plan": Plan(**rep["plan"]),
                        "at_launch": rep["prediction"], **measured(rep)})
    return out


def refit_profiles(root: Path, first: list[dict], tmp: Path) -> tuple[str, dict[str, str]]:
    """`calibrate --from-run` with this checkout's model: over all first-grid reports (in-sample), and
    per configuration without that configuration's report (held-out)."""
    from rich.console import Console
    quiet = Console(file=io.StringIO())
    base = str(root / "h100-calibrated.toml")

    def fit(paths, name):
        return str(calibrate_from_runs(paths, base=base, out=str(tmp / f"{name}.toml"), console=quiet)[0])

    held = {r["name"]: fit([o["path"] for o in first if o["name"] != r["name"]], r["name"]) for r in first}
    return fit([r["path"] for r in first], "all"), held


def refit_third(root: Path, rs: list[dict], tmp: Path) -> str:
    from rich.console import Console
    paths = [r["path"] for r in rs if r["grid"] in NEW_RUNS]
    return str(calibrate_from_runs(paths, base=str(root / "h100-calibrated.toml"), out=str(tmp / "s3.toml"),
                                   console=Console(file=io.StringIO()))[0])


def rel(p: float, m: float) -> float:
    return (p - m) / m


def summary_row(label: str, picked: list[dict], n: str) -> str:
    """One summary line: profile n's step-time and memory errors over the picked runs."""
    s = [abs(rel(r["pred"][n][0], r["step_s"])) for r in picked]
    m = [abs(rel(r["pred"][n][1], r["reserved"])) for r in picked]
    ma = [abs(rel(r["pred"][n][1], r["allocated"])) for r in picked]
    return (f"| {label} | {len(s)} | {statistics.median(s):.1%} | {max(s):.1%} | "
            f"{sum(x <= STEP_BAR for x in s)}/{len(s)} | {statistics.median(m):.1%} / {max(m):.1%} | "
            f"{sum(x <= MEM_BAR for x in m)}/{len(m)} | {statistics.median(ma):.1%} / {max(ma):.1%} | "
            f"{sum(x <= MEM_BAR for x in ma)}/{len(ma)} |")


def build(root: Path) -> tuple[list[str], dict]:
    rs = runs(root)
    first = [r for r in rs if r["grid"] == "grid"]
    with tempfile.TemporaryDirectory() as tmp:
        refit, held = refit_profiles(root, first, Path(tmp))
        profiles = {"datasheet": "h100-sxm-80gb", "calibrated": str(root / "h100-calibrated.toml"), "refit": refit,
                    "refit-s3": refit_third(root, rs, Path(tmp))}
        for r in rs:
            r["pred"] = {k: predict(r["plan"], p) for k, p in profiles.items()}
            r["pred"]["held-out"] = predict(r["plan"], held[r["name"]]) if r["name"] in held else (None, None)
        phases = phase_table(rs, profiles["refit-s3"], "refit-s3 (in-sample: fitted on these runs)")
    names = ["datasheet", "calibrated", "refit", "held-out", "refit-s3"]
    lines = ["| grid | run | recompute | mbs | step meas ms | " + " | ".join(f"{n} err" for n in names) +
             " | reserved GB | allocated GB | mem pred GB | err vs reserved | err vs allocated |",
             "|---|---|---|---|---|" + "---|" * len(names) + "---|---|---|---|---|"]
    stats: dict = {n: {"step": [], "mem": [], "mem_alloc": []} for n in names}
    for r in rs:
        errs = []
        for n in names:
            p_step, p_mem = r["pred"][n]
            if p_step is None:
                errs.append("-")
                continue
            e = rel(p_step, r["step_s"])
            stats[n]["step"].append(e)
            stats[n]["mem"].append(rel(p_mem, r["reserved"]))
            stats[n]["mem_alloc"].append(rel(p_mem, r["allocated"]))
            errs.append(f"{e:+.1%}")
        p_mem = r["pred"]["refit"][1]  # memory does not depend on the profile's speed terms
        par = r["plan"].parallel
        lines.append(f"| {r['grid']} | {r['name']} | {par.recompute} | {r['plan'].training.micro_batch_size} | "
                     f"{r['step_s'] * 1e3:.1f} | " + " | ".join(errs) +
                     f" | {r['reserved'] / 1e9:.2f} | {r['allocated'] / 1e9:.2f} | {p_mem / 1e9:.2f} | "
                     f"{rel(p_mem, r['reserved']):+.1%} | {rel(p_mem, r['allocated']):+.1%} |")
    summary = ["", "| profile | runs | step median abs err | step max abs err | within 15 % | "
                   "memory vs reserved: median / max abs err | within 10 % | memory vs allocated: median / max | within 10 % |",
               "|---|---|---|---|---|---|---|---|---|"]
    for subset, which in (("", None), (" (third session's runs)", True), (" (first two sessions' runs)", False)):
        for n in names:
            picked = [r for r in rs if r["pred"][n][0] is not None and (which is None or (r["grid"] in NEW_RUNS) == which)]
            summary.append(summary_row(f"{n}{subset}", picked, n))
    return lines + summary + spread(rs) + phases, {"runs": rs, "stats": stats}


def build_session(root: Path, first_root: Path = FIRST) -> tuple[list[str], dict]:
    """A later device session's grids (<root>/grids.json names the calibrate output each grid is
    predicted with, and which runs ran on the calibrate's machine): every run predicted with the
    datasheet profile, with the session's calibrated profile, and with that profile refit
    (`calibrate --from-run`) over the first session's 17 phase reports -- launches on other machines,
    a day earlier: out of sample for every run here."""
    from rich.console import Console
    quiet = Console(file=io.StringIO())
    meta = json.loads((root / "grids.json").read_text())
    grids = meta["grids"]
    # the session's GPU kind: its shipped profile is the datasheet column (a session on another kind than the
    # H100, e.g. benchmarks/gpu_h200.sh's, names it in grids.json)
    datasheet = meta.get("datasheet", "h100-sxm-80gb")
    earlier = [str(p) for g in NEW_RUNS for p in sorted((first_root / g).glob("*/report.json"))]
    # the refit over the first session's H100 reports only where the runs are H100s (calibrate refuses another base);
    # on another kind, the refit is over this session's own other runs, one fit per run without that run (held out)
    h100 = datasheet == "h100-sxm-80gb"
    session_reports = sorted(root.glob("*/*/report.json"))
    held_out = not h100 and len(session_reports) > 1  # a held-out fit needs another report
    names = ["datasheet", "calibrated"] + (["calibrated+refit"] if h100 else
                                           ["calibrated+refit held-out"] if held_out else [])
    rs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for grid, spec in grids.items():
            cal = str(root / spec["calibrated"])
            profiles = [datasheet, cal]
            if "calibrated+refit" in names:
                profiles.append(str(calibrate_from_runs(earlier, base=cal, out=str(Path(tmp) / f"{grid}.toml"),
                                                        console=quiet)[0]))
            same = spec["same_machine"]
            for rep_path in sorted((root / grid).glob("*/report.json")):
                rep = json.loads(rep_path.read_text())
                plan = Plan(**rep["plan"])
                if held_out:  # `calibrate --from-run` over the session's other reports: out of sample for this one
                    others = [str(p) for p in session_reports if p != rep_path]
                    profiles = [datasheet, cal, str(calibrate_from_runs(
                        others, base=cal, out=str(Path(tmp) / f"{grid}-{rep_path.parent.name}.toml"), console=quiet)[0])]
                r = {"grid": grid, "name": rep_path.parent.name, "path": str(rep_path), "plan": plan, **measured(rep),
                     "same_machine": same is True or rep_path.parent.name in (same or ()),
                     "launch_bound": any("launch-bound" in w for w in rep["prediction"].get("warnings", []))}
                r["pred"] = {n: predict(plan, p) for n, p in zip(names, profiles)}
                rs.append(r)
    stats: dict = {n: {"step": [], "mem": [], "mem_alloc": []} for n in names}
    clocks = any(r["sm_mhz"] is not None for r in rs)  # a column only where the session's reports carry the clock
    lines = ["| grid | run | recompute | mbs | launch-bound | calibrated on its machine | step meas ms | " +
             ("SM MHz | " if clocks else "") +
             " | ".join(f"{n} err" for n in names) + " | reserved GB | allocated GB | mem pred GB | err vs reserved | "
             "err vs allocated |", "|---|---|---|---|---|---|---|" + "---|" * (len(names) + clocks) + "---|---|---|---|---|"]
    for r in rs:
        for n in names:
            stats[n]["step"].append(rel(r["pred"][n][0], r["step_s"]))
            stats[n]["mem"].append(rel(r["pred"][n][1], r["reserved"]))
            stats[n]["mem_alloc"].append(rel(r["pred"][n][1], r["allocated"]))
        p_mem = r["pred"]["datasheet"][1]
        lines.append(f"| {r['grid']} | {r['name']} | {r['plan'].parallel.recompute} | "
                     f"{r['plan'].training.micro_batch_size} | {'yes' if r['launch_bound'] else ''} | "
                     f"{'yes' if r['same_machine'] else ''} | {r['step_s'] * 1e3:.1f} | " +
                     (f"{r['sm_mhz']:.0f} | " if clocks and r["sm_mhz"] is not None else "- | " if clocks else "") +
                     " | ".join(f"{rel(r['pred'][n][0], r['step_s']):+.1%}" for n in names) +
                     f" | {r['reserved'] / 1e9:.2f} | {r['allocated'] / 1e9:.2f} | {p_mem / 1e9:.2f} | "
                     f"{rel(p_mem, r['reserved']):+.1%} | {rel(p_mem, r['allocated']):+.1%} |")
    out = ["", "| profile | runs | step median abs err | step max abs err | within 15 % | memory vs reserved: "
               "median / max abs err | within 10 % | memory vs allocated: median / max | within 10 % |",
           "|---|---|---|---|---|---|---|---|---|"]
    subsets = (("", lambda r: True), (" (launch-bound)", lambda r: r["launch_bound"]),
               (" (not launch-bound)", lambda r: not r["launch_bound"]),
               (" (launch-bound, calibrated on its machine)", lambda r: r["launch_bound"] and r["same_machine"]),
               (" (launch-bound, calibrated on another machine)", lambda r: r["launch_bound"] and not r["same_machine"]))
    for label, keep in subsets:
        for n in names:
            picked = [r for r in rs if keep(r)]
            if not picked:
                continue
            out.append(summary_row(f"{n}{label}", picked, n))
    return lines + out + across_days(rs, first_root), {"runs": rs, "stats": stats}


def across_days(rs: list[dict], first_root: Path) -> list[str]:
    """The same configuration on both days' machines: how much the measurement itself moves."""
    earlier: dict[tuple, list[float]] = {}
    for g in GRIDS:
        for p in sorted((first_root / g).glob("*/report.json")):
            rep = json.loads(p.read_text())
            key = (p.parent.name, rep["plan"]["parallel"]["recompute"])  # the planner may have chosen otherwise since
            earlier.setdefault(key, []).append(measured(rep)["step_s"] * 1e3)
    out = ["", f"The same configurations measured on {first_root.name}'s machines and on this session's "
               "(step ms; max / min over all of them):", "",
           "| run | launch-bound | earlier sessions | this session | max / min |", "|---|---|---|---|---|"]
    mine: dict[str, list[dict]] = {}
    for r in rs:
        mine.setdefault(r["name"], []).append(r)
    for name, group in mine.items():
        now = [g["step_s"] * 1e3 for g in group]
        before = earlier.get((name, group[0]["plan"].parallel.recompute), [])
        allv = before + now
        out.append(f"| {name} | {'yes' if group[0]['launch_bound'] else ''} | "
                   f"{' / '.join(f'{x:.1f}' for x in before) or '-'} | "
                   f"{' / '.join(f'{x:.1f}' for x in now)} | {max(allv) / min(allv):.2f} |")
    return out


def summary(datas: list[dict], source: str) -> dict:
    """The numbers planner/data/accuracy.json keeps (planner/accuracy.py prints them under a plan): every
    run's step-time median |error| with the datasheet profile and with its session's calibrated profile,
    and memory against the allocator's peak (the same for every profile), over all sessions' runs."""
    def pool(n, k):
        return [x for d in datas for x in d["stats"][n][k]]
    med = lambda xs: round(statistics.median(abs(x) for x in xs), 4)  # noqa: E731
    return {"source": source, "runs": len(pool("datasheet", "step")),
            "step_median_abs_error": {"datasheet": med(pool("datasheet", "step")),
                                      "calibrated": med(pool("calibrated", "step"))},
            "memory_vs_allocated_median_abs_error": med(pool("datasheet", "mem_alloc"))}


def build_all() -> tuple[list[dict], str]:
    """Every committed H100 session's runs, and the source line accuracy.json names them by."""
    datas = [build(FIRST)[1]] + [build_session(root)[1] for root in LATER]
    return datas, _source((FIRST, *LATER))


def build_h200() -> tuple[list[dict], str]:
    """The committed H200 sessions' runs, and their source line."""
    return [build_session(root)[1] for root in H200], _source(H200)


def _source(roots) -> str:
    rel_root = Path(__file__).resolve().parents[1]
    return ", ".join(p.relative_to(rel_root).as_posix() for p in roots)


def spread(rs: list[dict]) -> list[str]:
    """Configurations measured more than once: the run-to-run (and host-to-host) spread of the
    measurement itself, which bounds how close any prediction can be."""
    by: dict[str, list[dict]] = {}
    for r in rs:
        by.setdefault(r["name"], []).append(r)
    out = ["", "Configurations measured more than once (same plan; the grids ran on different device sessions, "
               "grid-phases and grid-phases-2 on the same machine):", "",
           "| run | runs | step ms (grid order) | max / min | prediction (refit) ms |", "|---|---|---|---|---|"]
    for name, group in by.items():
        if len(group) < 2:
            continue
        t = [g["step_s"] * 1e3 for g in group]
        out.append(f"| {name} | {len(t)} | {' / '.join(f'{x:.1f}' for x in t)} | {max(t) / min(t):.2f} | "
                   f"{group[0]['pred']['refit'][0] * 1e3:.1f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", help="a results folder: the first session's (grid/, grid-refit/, h100-calibrated.toml), "
                                 "or a later one with grids.json naming its grid folders and calibrated profiles")
    ap.add_argument("--out", help="markdown file to write (default: print)")
    a = ap.parse_args()
    root = Path(a.root)
    meta = json.loads((root / "grids.json").read_text()) if (root / "grids.json").exists() else None
    title = [f"# {(meta or {}).get('gpu', 'H100')} single-GPU launches: predicted against measured ({root.name})", ""]
    if meta:
        lines, data = build_session(root)
        about = meta["about"]
        refit = "calibrated+refit" in data["stats"]
        held = "calibrated+refit held-out" in data["stats"]
        intro = ("Generated by `python3 benchmarks/gpu_accuracy.py " + str(root) + "`. Measured: each run's report, "
                 "median step time after warm-up and the largest peak over ranks. Predicted: re-made from the report's "
                 "plan with this checkout's cost model under the datasheet profile" +
                 (", the session's calibrated profile, and that profile refit over the 17 phase reports of " + FIRST.name +
                  " (other machines, a day earlier). " if refit else
                  ", the session's calibrated profile, and that profile refit (`parplan calibrate --from-run`) over "
                  "the session's other reports, once per run without that run's own report (held out). " if held else
                  " and the session's calibrated profile. ") + about)
    else:
        lines, _ = build(root)
        intro = ("Generated by `python3 benchmarks/gpu_accuracy.py " + str(root) + "`. Measured: each run's report "
                 "(`parplan recommend ... --json | parplan launch -`, command in `<grid>/<run>/command.txt`), median step "
                 "time after warm-up and the largest peak over ranks. Predicted: re-made from the report's plan with this "
                 "checkout's cost model (the `prediction` in each report is the one printed at launch). "
                 "`grid` ran without expandable segments (launch set them from the second grid on).")
    write_or_print("\n".join(title + [intro, ""] + lines) + "\n", a.out)


def write_or_print(text: str, out: str | None) -> None:
    """A generated markdown page into --out, or on stdout without it."""
    if out:
        Path(out).write_text(text)
        print(f"wrote {out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
