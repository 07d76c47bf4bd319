"""How accurate the prediction printed beside a plan is, from measurements shipped with the package.

`planner/data/accuracy.json` is written by `python benchmarks/accuracy_report.py`: every published run of
`parplan validate`, grouped by the framework its prediction modelled (the median and largest |error|
of each group; sets marked plausibility-only are counted apart), and the single-H100 `parplan launch`
grids (benchmarks/results/2026-11-22-h100 and 2026-11-23-h100: step time with the datasheet profile and
with each session's calibrated profile, peak memory against the allocator's).  tests/test_validate.py and tests/test_gpu_results.py recompute
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


def entries(framework: str) -> list[dict]:
    """The same numbers as line(), for a plan's JSON (Prediction.accuracy)."""
    data = load()
    out = []
    pub = data.get("published", {}).get(framework)
    if pub and pub.get("runs"):
        out.append({"basis": "published runs (parplan validate)", "runs": pub["runs"],
                    "median_abs_error": pub["median_abs_error"], "max_abs_error": pub["max_abs_error"]})
    elif pub and pub.get("plausibility_runs"):
        out.append({"basis": "published runs, plausibility checks only (parplan validate)",
                    "runs": pub["plausibility_runs"], "median_abs_error": pub["plausibility_median_abs_error"]})
    h100 = data.get("h100_launches")
    if framework == "parplan" and h100:
        out.append({"basis": f"step time of single-H100 launches, datasheet profile ({h100['source']})",
                    "runs": h100["runs"], "median_abs_error": h100["step_median_abs_error"]["datasheet"]})
        out.append({"basis": f"peak memory of single-H100 launches against the allocator's ({h100['source']})",
                    "runs": h100["runs"], "median_abs_error": h100["memory_vs_allocated_median_abs_error"]})
    return out


def line(framework: str) -> str | None:
    """One line for a plan's summary: how close this framework's predictions came to measured runs."""
    data = load()
    pub = data.get("published", {}).get(framework)
    out = []
    if pub and pub.get("runs"):
        out.append(f"{pub['runs']} published runs, |error| median {_pct(pub['median_abs_error'])}, "
                   f"max {_pct(pub['max_abs_error'])} (parplan validate)")
    h100 = data.get("h100_launches")
    if framework == "parplan" and h100:
        step = h100["step_median_abs_error"]
        out.append(f"{h100['runs']} H100 launches, step |error| median {_pct(step['datasheet'])} "
                   f"(calibrated profile {_pct(step['calibrated'])}), memory {_pct(h100['memory_vs_allocated_median_abs_error'])}")
    if not out and pub and pub.get("plausibility_runs"):
        out.append(f"plausibility checks only: {pub['plausibility_runs']} published runs, |error| median "
                   f"{_pct(pub['plausibility_median_abs_error'])} (parplan validate)")
    if not out:
        return None
    return "how accurate: " + "; ".join(out)
