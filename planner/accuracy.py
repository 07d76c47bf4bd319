"""How accurate the prediction printed beside a plan is, from measurements shipped with the package.

`planner/data/accuracy.json` is written by `python benchmarks/accuracy_report.py`: every published run of
`parplan validate`, grouped by the framework its prediction modelled (a mixture of experts' apart: group()) (the
median and largest |error|
of each group; sets marked plausibility-only are counted apart), and the single-GPU `parplan launch`
grids (H100: benchmarks/results/2026-11-22-h100 and 2026-11-23-h100; H200: 2026-11-28-h200 and 2026-12-04-h200; step time with
the datasheet profile and with each session's calibrated profile, peak memory against the allocator's).  tests/test_validate.py and tests/test_gpu_results.py recompute
both and fail when the file no longer matches the cost model.  Nothing here imports torch.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).resolve().parent / "data" / "accuracy.json"


@lru_cache(maxsize=1)
def load() -> dict:
    try:
        return json.loads(PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


# gb300 before b300, gb200 before b200 and gh200 before h200: the superchip's or rack's name holds its GPU's; h200
# before h20, whose name it holds; the PCIe cards (the H100 NVL too) before their SXM parts (no run of a PCIe card is
# measured or published here: the SXM parts' are not theirs); the export-market H800, A800 and H20 their own kinds
# (their twins' silicon, another NVLink or compute: the H100's and A100's runs are not theirs)
GPU_KINDS = ("gb300", "b300", "gb200", "b200", "gh200", "h200", "h20", "h100-pcie", "h100-nvl", "h100", "h800",
             "a100-pcie", "a100", "a800", "mi355x", "mi325x", "mi300x", "l40s")


def _kind_in(text: str) -> str | None:
    # a device's name as calibrate records it ("NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe") spelled as a profile's
    from hardware_profiles import spelled_gpu_name
    text = spelled_gpu_name(text)
    return next((k for k in GPU_KINDS if k in text), None)


def gpu_kind(hardware: str | None) -> str | None:
    """The GPU kind a profile's name or path names (a100 for a100-sxm-40gb, h100 for a calibrated h100 copy); for a
    profile file named otherwise (`parplan calibrate --out my-node.toml`), the kind its own name or description
    names (the device calibrate measured on); else None."""
    kind = _kind_in(Path(str(hardware or "")).name)
    if kind is None and hardware:
        from hardware_profiles import looks_like_path
        if looks_like_path(hardware):
            kind = _profile_file_kind(str(hardware))
    return kind


@lru_cache(maxsize=16)
def _profile_file_kind(path: str) -> str | None:
    """The GPU kind of the device a profile file was calibrated on (hardware_profiles.calibrated_on: an H100 PCIe
    calibrated from the SXM part's profile keeps that profile's name), else the one its `name`, else its description,
    names; None where the file cannot be read (a plan from another machine)."""
    from hardware_profiles import calibrated_on, load_profile
    try:
        prof = load_profile(path)
    except Exception:  # noqa: BLE001 -- unreadable or invalid: no kind to tell, as for a file named otherwise
        return None
    return _kind_in(calibrated_on(prof)) or _kind_in(prof.name) or _kind_in(prof.description or "")


# the launch grids accuracy.json keeps, by GPU: (its key, the GPU's name in words, what a profile name holds)
LAUNCHES = (("h100_launches", "H100", "h100"), ("h200_launches", "H200", "h200"))


def launches_for(hardware: str | None) -> tuple[dict | None, str, bool]:
    """(the launch grid's numbers, its GPU in words, whether they were measured on the plan's GPU): the grid of the
    plan's GPU kind where one was measured (gpu_kind: h100-sxm-80gb, h200-..., a calibrated profile's file), else
    the H100's, said to be another GPU's."""
    data = load()
    kind = gpu_kind(hardware)
    for key, gpu, part in LAUNCHES:
        if part == kind and data.get(key):
            return data[key], gpu, True
    from hardware_profiles import looks_like_path
    # a profile file of the user's that names no GPU kind we can tell: the H100's numbers, without a claim about its
    # GPU; one that names a kind without launches (an A100's, an H100 PCIe's) is told none ran on it
    return data.get("h100_launches"), "H100", hardware is None or (looks_like_path(hardware) and kind is None)


def published_on(pub: dict, hardware: str | None) -> tuple[str | None, dict | None]:
    """(the plan's GPU kind, a framework's published-run summary on that kind, None where there is none)."""
    kind = gpu_kind(hardware)
    return kind, (pub.get("by_gpu", {}).get(kind) if kind else None)


# parplan's FP8 linears on a GPU, measured (launch warns an FP8 plan on CUDA with it): a runtime defect, not the model's
FP8_MEASURED = ("parplan's FP8 linears stepped 4.6-5.4x slower than predicted on their only GPU runs (two on an H100, "
                "2026-12-06, benchmarks/results/2026-12-06-h100; its FP8 GEMMs alone median 3.9 % from the model, the casts "
                "are under study)")
# parplan's mixture of experts on a GPU, measured (launch warns an MoE plan on CUDA with it, under a profile without
# the eager MoE block's dispatch)
MOE_MEASURED = ("parplan's mixture of experts stepped 1.58x its prediction on its only GPU run (an H100, 2026-12-06, "
                "benchmarks/results/2026-12-06-h100): its blocks run eagerly and dispatched 7.3 ms each against the "
                "compiled dense block's 2.7 the model counted (a profile calibrated since counts the eager block's own)")
# a mixture of experts planned for parplan's runtime (group "parplan-moe"): what is known of it
PARPLAN_MOE = (f"one GPU run: {MOE_MEASURED}; its memory model against the CPU allocator: "
               "benchmarks/results/2026-12-05-cpu-memory-moe, -moe-mixed with dense blocks between, -mla with latent "
               "attention, -mla-recompute and -moe-recompute with the recompute modules, -moe-zero2 under ZeRO-2, "
               "-moe-zero3 under ZeRO-3)")

# a mixture of experts planned for torchtitan (group "torchtitan-moe"): no run to hold it to
TORCHTITAN_MOE = ("no published or measured torchtitan run with experts found (its MoE layer's terms are Megatron-Core's "
                  "layer's, checked on published runs: --framework megatron prints them); torchtitan 0.2.2's own mesh "
                  "and parallelize code take the exported layout, the experts' shards as counted "
                  "(benchmarks/results/2026-12-07-export-parse-moe)")


def group(framework: str, moe: bool = False) -> str:
    """The key a plan's accuracy is kept under: its framework, and for a mixture of experts the framework's MoE runs
    apart ("megatron-moe": the MoE layer's own terms, checked on MoE runs only; a dense plan's line is not theirs)."""
    return f"{framework}-moe" if moe else framework


def entries(framework: str, hardware: str | None = None, fp8: bool = False) -> list[dict]:
    """The same numbers as line(), for a plan's JSON (Prediction.accuracy)."""
    data = load()
    out = []
    pub = data.get("published", {}).get(framework)
    if pub and pub.get("runs"):
        out.append({"basis": "published runs (parplan validate)", "runs": pub["runs"],
                    "median_abs_error": pub["median_abs_error"], "max_abs_error": pub["max_abs_error"]})
        kind, on = published_on(pub, hardware)
        if on:
            out.append({"basis": f"published runs on {kind.upper()} (parplan validate)", "runs": on["runs"],
                        "median_abs_error": on["median_abs_error"], "max_abs_error": on["max_abs_error"]})
    elif pub and pub.get("plausibility_runs"):
        out.append({"basis": "published runs, plausibility checks only (parplan validate)",
                    "runs": pub["plausibility_runs"], "median_abs_error": pub["plausibility_median_abs_error"]})
    grid, gpu, same = launches_for(hardware)
    if framework == "parplan" and grid:
        other = ("" if same else f"; no launches measured on {hardware}") + (f"; {FP8_MEASURED}" if fp8 else "")
        out.append({"basis": f"step time of single-{gpu} launches, datasheet profile ({grid['source']}{other})",
                    "runs": grid["runs"], "median_abs_error": grid["step_median_abs_error"]["datasheet"]})
        out.append({"basis": f"peak memory of single-{gpu} launches against the allocator's ({grid['source']}{other})",
                    "runs": grid["runs"], "median_abs_error": grid["memory_vs_allocated_median_abs_error"]})
    return out


def line(framework: str, hardware: str | None = None, fp8: bool = False) -> str | None:
    """One line for a plan's summary: how close this framework's predictions came to measured runs (the launches
    on the plan's GPU kind where there are some; else the H100's, saying so; an FP8 plan's, that they are 16-bit)."""
    data = load()
    pub = data.get("published", {}).get(framework)
    out = []
    if pub and pub.get("runs"):
        kind, on = published_on(pub, hardware)
        by_gpu = pub.get("by_gpu", {})
        kinds = f" on {', '.join(k.upper() for k in by_gpu)}" if by_gpu else ""
        runs = "published mixture-of-experts runs" if framework.endswith("-moe") else "published runs"
        if framework.endswith("-moe") and fp8:  # the MoE set is BF16 (megatron_moe_h100): say the plan's FP8 is not
            runs = "published BF16 mixture-of-experts runs (no FP8 one checked)"
        every = (f"{pub['runs']} {runs}{kinds}, |error| median {_pct(pub['median_abs_error'])}, "
                 f"max {_pct(pub['max_abs_error'])}")
        if on and on["runs"] < pub["runs"]:  # the plan's GPU kind first, then all (the sets span GPU kinds)
            out.append(f"{on['runs']} {runs} on {kind.upper()}, |error| median {_pct(on['median_abs_error'])}, "
                       f"max {_pct(on['max_abs_error'])} (all {pub['runs']}{kinds}: median "
                       f"{_pct(pub['median_abs_error'])}, max {_pct(pub['max_abs_error'])}; parplan validate)")
        else:  # all on the plan's kind, or none on it (said), or a profile of no kind we can tell
            none = f"none published on {kind.upper()}; " if kind and by_gpu and not on else ""
            out.append(f"{none}{every} (parplan validate)")
    grid, gpu, same = launches_for(hardware)
    if framework == "parplan" and grid:
        step = grid["step_median_abs_error"]
        out.append(("" if same else f"none launched on {hardware}; ") +
                   f"{grid['runs']} {gpu} launches, step |error| median {_pct(step['datasheet'])} "
                   f"(calibrated profile {_pct(step['calibrated'])}), memory {_pct(grid['memory_vs_allocated_median_abs_error'])}"
                   + (f" ({FP8_MEASURED})" if fp8 else ""))
    if framework == "parplan-moe":
        out.append(PARPLAN_MOE)
    if framework == "torchtitan-moe":
        out.append(TORCHTITAN_MOE)
    if not out and pub and pub.get("plausibility_runs"):
        out.append(f"plausibility checks only: {pub['plausibility_runs']} published runs, |error| median "
                   f"{_pct(pub['plausibility_median_abs_error'])} (parplan validate)")
    if not out:
        return None
    return "how accurate: " + "; ".join(out)
