"""One training step under torch.profiler (``parplan launch --profile DIR``): where each rank's step went.

The step is one more than the run's measured steps (``--steps N`` measures N and profiles step N+1), so the
profiler's own cost is in no reported step time.  Each rank writes, under DIR:

- ``rank{r}.ops.json``: every operator and kernel of the step (torch.profiler's ``key_averages``): its kind (a kernel
  on the device, a host operator, or a record_function range), calls, self and total host (CPU) time, self and total
  device time, in microseconds, ordered by self device time then self host time; with the step's wall time, the
  kernels' summed time (the GPU's busy time: kernels, copies, memsets; a host operator's self device time is its
  kernels' again, so it is left out, as torch's own table does) and the host operators' summed self time;
- ``rank{r}.ops.md``: the same as two tables for people, the top kernels by device time and the top host operators
  by self time;
- ``rank{r}.trace.json.gz``: the step's timeline (Chrome trace format: ui.perfetto.dev or chrome://tracing).

What it answers is whether a step was held up by the GPU's work (device busy close to the wall time: then the top
kernels say which) or by the host (the GPU idle much of the step: the top host operators say which): the question a
run far from its prediction asks first.  On CPU there is no device time, and the tables are the host's alone.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil

from torch.profiler import ProfilerActivity, profile

TOP = 25  # rows in each table of ops.md


def start(device_type: str):
    """A running profiler of this process's host operators, and of the GPU's kernels on cuda; or the reason it would
    not start, as a string (the run goes on: its measured steps are done, and the report says why no profile)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    try:
        prof = profile(activities=activities, record_shapes=False, with_stack=False)
        prof.__enter__()
    except Exception as e:  # noqa: BLE001 -- a profiler that cannot start (no CUPTI, another profiler running)
        return _why(e)
    return prof


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")


def _us(evt, name: str) -> float:
    return float(getattr(evt, name, 0.0) or 0.0)


def _kind(e) -> str:
    """"kernel" for what ran on the device (kernels, copies, memsets), "range" for a record_function range's device
    span, "op" for a host operator (whose self device time is its kernels' again: torch's table sums kernels only)."""
    if getattr(e, "is_user_annotation", False):
        return "range"
    return "op" if str(getattr(e, "device_type", "CPU")).endswith("CPU") else "kernel"


def op_rows(prof: profile) -> list[dict]:
    """Each operator or kernel of the profiled span: its kind (_kind), name, calls, and host and device times
    (microseconds), by self device time, then self host time, largest first."""
    rows = [{"kind": _kind(e), "name": e.key, "calls": int(e.count),
             "self_device_us": _us(e, "self_device_time_total"), "device_us": _us(e, "device_time_total"),
             "self_host_us": _us(e, "self_cpu_time_total"), "host_us": _us(e, "cpu_time_total")}
            for e in prof.key_averages()]
    return sorted(rows, key=lambda r: (-r["self_device_us"], -r["self_host_us"], r["name"]))


def summary(rows: list[dict], wall_s: float, step: int, device_type: str) -> dict:
    """The step's wall time against the device's busy time (the sum of the kernels' self time) and the host
    operators' self time."""
    kernels = [r for r in rows if r["kind"] == "kernel"]
    busy = sum(r["self_device_us"] for r in kernels) / 1e6 if device_type == "cuda" else None
    top = next((r for r in kernels if r["self_device_us"] > 0), None) if device_type == "cuda" else None
    return {"step": step, "wall_s": wall_s, "device_busy_s": busy,
            "device_busy_fraction": None if busy is None or wall_s <= 0 else busy / wall_s,
            "host_self_s": sum(r["self_host_us"] for r in rows if r["kind"] != "kernel") / 1e6,
            "top_device_op": None if top is None else {"name": top["name"], "calls": top["calls"],
                                                       "self_device_s": top["self_device_us"] / 1e6}}


def _table(rows: list[dict], key: str) -> list[str]:
    out = ["| operator / kernel | calls | self device ms | self host ms | total host ms |", "|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: -r[key])[:TOP]:  # (ties: op_rows's order)
        if r[key] <= 0:
            break
        name = r["name"].replace("|", "\\|")
        name = name if len(name) <= 110 else name[:107] + "..."
        out.append(f"| {name} | {r['calls']} | {r['self_device_us'] / 1e3:.3f} | {r['self_host_us'] / 1e3:.3f} | "
                   f"{r['host_us'] / 1e3:.3f} |")
    return out


def markdown(rows: list[dict], s: dict, rank: int) -> str:
    lines = [f"# Rank {rank}, step {s['step']} under torch.profiler (parplan launch --profile)", "",
             f"Step wall time {s['wall_s'] * 1e3:.1f} ms (the profiler's overhead included; the report's measured "
             "steps are the ones before it)."]
    if s["device_busy_s"] is not None:
        lines.append(f"Device busy {s['device_busy_s'] * 1e3:.1f} ms, {s['device_busy_fraction']:.0%} of the step "
                     "(the sum of every kernel's and copy's self time): "
                     + ("the GPU's work holds the step up; its top kernels below say which."
                        if s["device_busy_fraction"] >= 0.8 else
                        "the GPU waits for the host much of the step; the host table below says on what."))
    lines.append(f"Host operators' self time {s['host_self_s'] * 1e3:.1f} ms.")
    if s["device_busy_s"] is not None:
        lines += ["", f"## Top {TOP} kernels by device time", ""] + _table([r for r in rows if r["kind"] == "kernel"],
                                                                          "self_device_us")
    lines += ["", f"## Top {TOP} host operators by self time", ""] + _table([r for r in rows if r["kind"] != "kernel"],
                                                                           "self_host_us")
    return "\n".join(lines) + "\n"


def finish(prof, out_dir: str, rank: int, step: int, wall_s: float, device_type: str) -> dict:
    """Stop the profiler and write this rank's three files; the step's summary, with the files' paths; or, where the
    profiler did not start (start's reason) or its tables could not be made or written, {"step", "wall_s", "error"}."""
    if isinstance(prof, str):
        return {"step": step, "wall_s": wall_s, "error": f"the profiler did not start: {prof}"}
    try:
        return _write(prof, out_dir, rank, step, wall_s, device_type)
    except Exception as e:  # noqa: BLE001 -- the measured steps are done: the report says why there is no profile
        return {"step": step, "wall_s": wall_s, "error": f"profiling failed: {_why(e)}"}


def _write(prof: profile, out_dir: str, rank: int, step: int, wall_s: float, device_type: str) -> dict:
    prof.__exit__(None, None, None)
    os.makedirs(out_dir, exist_ok=True)
    rows = op_rows(prof)
    s = summary(rows, wall_s, step, device_type)
    base = os.path.join(out_dir, f"rank{rank}")
    with open(base + ".ops.json", "w") as f:
        json.dump({**s, "ops": rows}, f, indent=1)
    with open(base + ".ops.md", "w") as f:
        f.write(markdown(rows, s, rank))
    raw = base + ".trace.json"
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    return {**s, "files": [base + ".ops.md", base + ".ops.json", raw + ".gz"]}

