"""`parplan calibrate`: measure this machine into a hardware profile, or refit one from run reports.

Device mode (``calibrate_device``) measures with plain PyTorch on the local device (CUDA events
on a GPU; ``time.perf_counter`` around ``synchronize`` otherwise; warm-ups, then the median of
N samples, each sample a loop long enough to swamp the timer):

  (a) matmul_efficiency_curve: the transformer GEMMs the cost model prices
      (``cost_models.compute.layer_gemms`` for hidden 2048-12288, tp 1/2/4/8, 4096/16384 tokens;
      bf16 and fp16 on a GPU), each row a point (GFLOP, achieved / datasheet peak), binned exactly
      like benchmarks/build_h100_curve.py (``binned_curve``: equal-width log10(GFLOP) bins, bin
      medians, weighted isotonic smoothing; that script imports it from here);
  (b) attention_efficiency_curve: F.scaled_dot_product_attention causal forward+backward by
      sequence length (causal FLOPs = half of 4*b*heads*s^2*d forward, backward 2.5x), isotonic;
  (c) hbm_efficiency: a large device copy (read + write bytes) / the base's datasheet bandwidth;
  (d) host_link_gbytes_per_s: pinned host<->device copies, the slower direction;
  (e) with >= 2 GPUs, NCCL all-reduce / all-gather / reduce-scatter / send-recv in spawned local
      processes: nvlink.efficiency = large all-reduce bus bandwidth / link bandwidth, and
      nvlink.latency_s = small-message all-reduce time / its 2(n-1) ring steps.  With one GPU
      the base profile's network values are kept (and the profile says so);
  (f) with >= 2 GPUs, overlap_compute_slowdown: a train of large bf16 GEMMs timed alone and
      again while asynchronous all-reduces run beside it (``overlap_slowdown``), the slowest rank's
      ratio - 1 (the base profile's literature value is kept with one GPU).

With --device cpu (asked for by name: --device auto without a CUDA GPU is refused) there is no
datasheet peak: the best fp32 GEMM throughput measured is used as the "peak" of every dtype and the
copy bandwidth as the memory bandwidth: a self-calibration for testing the tool only, which stderr
says before and after the run, and the profile's ``measured`` and ``description`` too.

Run mode (``calibrate_from_runs``) refits, from `parplan launch` reports (each reduced to the median of its
timed steps, those after the warm-up: a report with none, e.g. `launch --steps 1`, is refused), five groups of
fields, each on the reports that expose it:
  (1) optimizer_bandwidth_fraction and optimizer_host_per_tensor_s: least squares over the after-backward phase
      (gradient reduction + optimizer step) of the one-rank reports that carry it (two or more needed);
  (2) sustained_matmul_fraction: per report, the value at which ``planner.core.evaluate_plan`` predicts the measured
      step time; the median over the compute-bound reports (the base's cost model does not call them launch-bound),
      clamped to (0, 1].  If every report is launch-bound and the base has a measured host dispatch, the base's
      fraction is kept; a base with no host dispatch for a report's recompute mode cannot tell that report
      launch-bound, so it joins the fit (a warning on stderr says so and names `calibrate --host-only`);
  (3) host_forward_share per recompute mode: the median forward share of the dispatch, measured from the phases of
      the launch-bound one-stage reports;
  (4) host_block_s per recompute mode: per launch-bound report, the dispatch per block that predicts its step (with
      the fraction and shares above); the median per mode (only where the base has a measured dispatch);
  (5) memory_reserve_gbytes: the base's own reserve + the median of measured reserved peak - predicted total, never
      < 0; the fitted part kept apart as memory_slack_gbytes, so a refit of a refit replaces it.
The base is --base, else the first report's plan hardware (a relative path found from here or from the report's
folder up); reports from another GPU than the base describes are refused where both are known GPU families, and a
device or base naming no known GPU gets a note on stderr that the two could not be matched.

No mode writes over the --base file: a default --out that would be it gets a suffix, an --out that
names it is refused; in run mode an --out that names one of the reports is refused too.

torch is imported only inside the device-mode functions: run mode and the binning helpers
stay importable without it.
"""
from __future__ import annotations

import collections
import datetime
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cost_models.hardware import TEST_ONLY_MARK
from planner.limits import can_make_folder_in
from planner.toml_text import toml_value
from planner.topology import cpu_name

N_BINS = 10
TOOL = "parplan calibrate"
GB = 1e9

# GPU name fragment (of the device's name as hardware_profiles.spelled_gpu_name spells it) -> shipped profile; first
# match wins.  None: a part no shipped profile describes whose name holds a profiled part's ("NVIDIA H800 PCIe" holds
# the SXM part's "h800"): unmatched, the default base, as any GPU without a profile.
_GPU_PROFILES: list[tuple[str, str | None]] = [
    # the GH200s before h200, which the superchip's name contains: "NVIDIA GH200 144G HBM3e" (144 GB HBM3e, its NVL2
    # node) before the 96 GB HBM3 part's "NVIDIA GH200 480GB"
    ("gh200-144g", "gh200-144gb"),
    ("gh200", "gh200-96gb"),
    ("h200", "h200-sxm-141gb"),
    # the H20 ("NVIDIA H20") after h200, whose name contains its; the H20-3e ("NVIDIA H20-3e": 141 GB of HBM3e, not
    # the 96 GB part's memory system) before it
    ("h20-3e", "h20-3e-141gb"),
    ("h20", "h20-96gb"),
    ("h100-pcie", "h100-pcie-80gb"),  # "NVIDIA H100 PCIe", before the SXM part's "NVIDIA H100 80GB HBM3"
    ("h100-nvl", "h100-nvl-94gb"),  # "NVIDIA H100 NVL" (bridged pairs, 94 GB), not the SXM part's NVSwitch node
    ("h100", "h100-sxm-80gb"),
    # the H800's PCIe cards (NVLink bridges in pairs, no NVSwitch) are not the SXM part's node: no profile of their own
    ("h800-pcie", None),
    ("h800-nvl", None),
    ("h800", "h800-sxm-80gb"),  # "NVIDIA H800", "NVIDIA H800 80GB HBM3": the SXM part
    # "NVIDIA A800-SXM4-80GB"; the A800's PCIe cards ("NVIDIA A800 80GB PCIe") hold no "a800-sxm": unmatched
    ("a800-sxm", "a800-sxm-80gb"),
    # "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB" (the PCIe node; the 40 GB card's memory is measured)
    ("a100-pcie", "a100-pcie-80gb"),
    ("a100-sxm4-40gb", "a100-sxm-40gb"),
    ("a100", "a100-sxm-80gb"),
    ("gb300", "gb300-nvl72"),  # before b300, which its name contains ("NVIDIA GB300")
    ("b300", "b300"),  # "NVIDIA B300 SXM6 AC"
    ("gb200", "gb200-nvl72"),  # before b200, which its name contains
    ("b200", "b200"),
    ("mi355x", "mi355x"),
    ("mi325x", "mi325x"),
    ("mi300x", "mi300x"),
    ("l40s", "l40s"),  # "NVIDIA L40S"
]
DEFAULT_BASE = "h100-sxm-80gb"
PORT_TRIES = 3  # starts of spawned ranks, each on a fresh port, where the port was taken meanwhile (spawn_on_a_free_port)


class CalibrationError(ValueError):
    """Invalid input to calibrate; the message is one line."""


# ----------------------------------------------------------------------------------------------
# Curve binning (shared with benchmarks/build_h100_curve.py)
# ----------------------------------------------------------------------------------------------

def isotonic_increasing(values: list[float], weights: list[float]) -> list[float]:
    """Weighted pool-adjacent-violators: the non-decreasing sequence closest to `values` in weighted L2."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out.extend([v] * n)
    return out


def binned_curve(points: list[tuple[float, float]], n_bins: int = N_BINS) -> list[tuple[float, float]]:
    """Median (GFLOP, efficiency) per equal-width log10(GFLOP) bin, then made monotone."""
    logs = [math.log10(g) for g, _ in points]
    lo, hi = min(logs), max(logs)
    width = (hi - lo) / n_bins
    bins: list[list[tuple[float, float]]] = [[] for _ in range(n_bins)]
    for (g, e), lg in zip(points, logs):
        i = min(int((lg - lo) / width), n_bins - 1) if width > 0 else 0
        bins[i].append((g, e))
    xs, ys, ws = [], [], []
    for b in bins:
        if not b:
            continue
        xs.append(statistics.median(g for g, _ in b))
        ys.append(statistics.median(e for _, e in b))
        ws.append(len(b))
    ys = isotonic_increasing(ys, ws)
    return list(zip(xs, ys))


def _clamp_eff(e: float) -> float:
    return min(1.0, max(1e-4, round(e, 4)))


def _round_curve(curve) -> list[list[float]]:
    """Rounded for the file; x strictly increasing, efficiencies inside (0, 1]."""
    out: list[list[float]] = []
    for x, y in curve:
        x = float(f"{x:.6g}")
        if out and x <= out[-1][0]:
            continue
        out.append([x, _clamp_eff(y)])
    return out


# ----------------------------------------------------------------------------------------------
# Profile I/O
# ----------------------------------------------------------------------------------------------

def profile_toml(profile) -> str:
    """A HardwareProfile as TOML (scalars and inline values first, then [nvlink] and [inter_node])."""
    data = profile.model_dump(mode="json")
    lines = [f"# Hardware profile written by {TOOL}; units live in the field names "
             "(GB = 1e9 bytes, bandwidths per GPU per direction)."]
    tables = {}
    for key, value in data.items():
        if value is None or value == {}:
            continue
        if isinstance(value, dict) and key != "peak_dense_tflops":
            tables[key] = value
        elif key in ("sources",) or (isinstance(value, list) and value and isinstance(value[0], (list, tuple))):
            lines.append(f"{key} = [\n" + "".join(f"  {toml_value(x)},\n" for x in value) + "]")
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, table in tables.items():
        lines.append(f"\n[{key}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in table.items() if v is not None)  # unset: the default
    return "\n".join(lines) + "\n"


def base_file(base: str) -> Path:
    """The file the profile `base` (a name or a path) is read from."""
    import hardware_profiles
    return hardware_profiles.profile_file(base).resolve()


def _same_file(a: Path, b: Path | None) -> bool:
    if b is None:
        return False
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check_out_path(out: str | None, default_name: str, base_path: Path | None = None,
                   suffix: str = "-new", console=None) -> Path:
    """--out, or `<default_name>.toml`; never the --base file `base_path`: an --out naming it is refused,
    and a default that would be it gets `suffix` added (a calibrated or refit base keeps what it holds); a
    default that names an existing file gets -2, -3, ... (only an explicit --out replaces a file)."""
    if out:
        path = Path(out)
    else:
        path = Path(f"{default_name}.toml")
        first = path
        while _same_file(path, base_path):
            path = path.with_name(f"{path.stem}{suffix}{path.suffix}")
        if path != first and console is not None:
            console.print(f"note: writing {path}, not {first}: that is the --base file, which is kept",
                          markup=False, highlight=False, soft_wrap=True)
        taken, n = path, 2
        while path.exists():  # a default never replaces a file: an earlier calibration keeps what it holds
            path = taken.with_name(f"{taken.stem}-{n}{taken.suffix}")
            n += 1
        if path != taken and console is not None:
            console.print(f"note: writing {path}, not {taken}, which exists (pass --out {taken} to replace it)",
                          markup=False, highlight=False, soft_wrap=True)
    if path.suffix not in (".toml", ".json"):
        raise CalibrationError(f"--out {path}: give a .toml or .json file name")
    if path.is_dir():
        raise CalibrationError(f"--out {path} is a directory; give a .toml or .json file name")
    if out and _same_file(path, base_path):
        raise CalibrationError(f"--out {out} is the --base profile itself, which it would overwrite -- fix: give "
                               f"another --out (or none: the default is a new file)")
    if out and _is_launch_report(path):  # another run's report: a measurement that no profile may replace
        raise CalibrationError(f"--out {out} is a launch report, which the profile would overwrite -- fix: give "
                               "another --out (or none: the default is a new file)")
    if out and path.is_file() and not _is_profile(path):  # a profile (an earlier calibration) may be replaced
        raise CalibrationError(f"--out {out} exists and is not a hardware profile, which it would overwrite -- fix: "
                               "give another --out (or none: the default is a new file)")
    # before any measurement (a device calibration takes minutes): where the file would go must be a writable folder
    folder = next((q for q in path.absolute().parents if q.exists()), None)
    if folder is not None and (not folder.is_dir() or not can_make_folder_in(folder)):
        why = "is a file, not a folder" if not folder.is_dir() else "is not writable"
        raise CalibrationError(f"--out {path}: {folder} {why} -- fix: give --out in a folder you can write")
    return path


def _is_profile(path: Path) -> bool:
    """Whether the file reads as a hardware profile (what --out may replace; a plan or a report it had overwritten)."""
    import hardware_profiles
    try:
        hardware_profiles.load_profile(path)
    except Exception:  # noqa: BLE001 - anything that does not load is no profile to replace
        return False
    return True


def write_profile(profile, path: Path) -> Path:
    """Write TOML (or JSON for a .json path) and re-load it with hardware_profiles.load_profile."""
    import hardware_profiles

    text = (json.dumps(profile.model_dump(mode="json"), indent=2) + "\n") if path.suffix == ".json" else profile_toml(profile)
    try:
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise CalibrationError(f"cannot write {path}: {e.__class__.__name__}: {e.strerror or e}") from None
    hardware_profiles.load_profile(path)  # the contract: what we write, the planner reads
    return path


def _load_base(name: str, what: str = "--base", fix: str = ""):
    import hardware_profiles
    try:
        return hardware_profiles.load_profile(name)
    except (ValueError, OSError) as e:
        raise CalibrationError(f"{what}: {' '.join(str(e).split())}{fix}") from None


def base_for_device(device_name: str) -> tuple[str, bool]:
    """(profile name, matched) for a GPU name such as 'NVIDIA H100 80GB HBM3'."""
    from hardware_profiles import spelled_gpu_name
    low = spelled_gpu_name(device_name)
    for frag, name in _GPU_PROFILES:
        if frag in low:
            return (name, True) if name else (DEFAULT_BASE, False)
    return DEFAULT_BASE, False


def _calibrated_name(name: str, tag: str = "-calibrated") -> str:
    from hardware_profiles import looks_like_path
    name = Path(name).stem if looks_like_path(name) else name
    return name if name.endswith(tag) else f"{name}{tag}"


def cpu_warning(what: str = "its peaks and bandwidths are this CPU's (about 0.1 TFLOP/s), not a GPU's") -> str:
    return (f"warning: --device cpu: a self-calibration of this CPU FOR TESTING THE TOOL ONLY: {what}; never plan "
            "real runs with the profile")
NO_GPU = ("no CUDA GPU here to calibrate -- fix: run it on the GPU node, or pass --device cpu for a test-only "
          "self-calibration of this CPU")


def device_capacity_bytes(index: int = 0) -> int:
    """The CUDA device's memory as its allocator sees it (cudaDeviceProp.totalGlobalMem)."""
    import torch
    return int(torch.cuda.get_device_properties(index).total_memory)


def _today() -> str:
    return datetime.date.today().isoformat()


def _console():
    from rich.console import Console
    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=160)
    return console


# ----------------------------------------------------------------------------------------------
# Device measurements
# ----------------------------------------------------------------------------------------------

class _Timer:
    """Median seconds of one call of `fn`: warm-ups, then `reps` samples, each a loop of `inner`
    calls sized so that one sample lasts about `sample_s` (swamps timer and launch jitter)."""

    def __init__(self, torch, device, warmup: int, reps: int, sample_s: float):
        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        self.warmup, self.reps, self.sample_s = warmup, reps, sample_s

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        est = max(time.perf_counter() - t0, 1e-7)
        inner = int(min(1000, max(1, self.sample_s / est)))
        samples = []
        for _ in range(self.reps):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                self.sync()
                samples.append((time.perf_counter() - t0) / inner)
        return statistics.median(samples)


def gemm_shapes(on_gpu: bool, quick: bool) -> list[dict]:
    """The forward GEMMs of one block (cost_models.compute.layer_gemms) as (m, k, n) rows.

    The same family as benchmarks/reference/h100_gemm.json: multi-head attention (heads of 128),
    MLP 4h, m = tokens, columns/rows split by the tensor-parallel degree t."""
    from cost_models.compute import layer_gemms
    from cost_models.layout import ModelDims

    if on_gpu:
        hiddens, tps, tokens_list = ((2048, 8192, 12288), (1, 4), (4096, 16384)) if quick else \
            ((2048, 4096, 8192, 12288), (1, 2, 4, 8), (4096, 16384))
    else:
        hiddens, tps, tokens_list = ((256, 512, 1024), (1, 2), (256, 1024)) if quick else \
            ((512, 1024, 2048), (1, 2, 4), (1024, 2048))
    rows = []
    for h in hiddens:
        heads = max(1, h // 128) if h >= 1024 else max(1, h // 64)
        m = ModelDims(arch="gpt", layers=1, hidden=h, heads=heads, kv_heads=heads, head_dim=h // heads,
                      ffn=4 * h, vocab=32000, tied=False, seq_len=4096, positions=4096)
        for t in tps:
            for tokens in tokens_list:
                dims = {"qkv": (h, (m.q_width + 2 * m.kv_width) // t), "proj": (m.q_width // t, h),
                        "fc1": (h, m.ffn // t), "fc2": (m.ffn // t, h)}
                for op, flops in layer_gemms(m, tokens, t):
                    k, n = dims[op]
                    assert abs(2.0 * tokens * k * n - flops) < 1e-6 * flops, (op, flops)
                    rows.append({"h": h, "t": t, "tokens": tokens, "op": op, "m": tokens, "k": k, "n": n})
    return rows


def measure_gemms(torch, device, timer, shapes, dtype_name, advance) -> list[dict]:
    """Each (m, k, n) row's GEMM timed in `dtype_name`.  fp8: torch._scaled_mm of E4M3 operands with per-tensor fp32
    scales into bf16, the second operand column-major (cuBLASLt's FP8 GEMM takes only that layout on Hopper): the
    GEMM an FP8 linear runs (Transformer Engine and torchao call the same cuBLASLt kernels); k and n must be
    multiples of 16."""
    out = []
    gen = torch.Generator(device=device).manual_seed(0)
    one = torch.ones((), device=device, dtype=torch.float32)
    for r in shapes:
        if dtype_name == "fp8":
            f8 = torch.float8_e4m3fn
            x = torch.randn(r["m"], r["k"], device=device, generator=gen).to(f8)
            w = torch.randn(r["n"], r["k"], device=device, generator=gen).to(f8).t()
            s = timer(lambda: torch._scaled_mm(x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        else:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
            x = torch.randn(r["m"], r["k"], device=device, dtype=dtype, generator=gen)
            w = torch.randn(r["k"], r["n"], device=device, dtype=dtype, generator=gen)
            c = torch.empty(r["m"], r["n"], device=device, dtype=dtype)
            s = timer(lambda: torch.mm(x, w, out=c))
            del c
        out.append({**r, "dtype": dtype_name, "s": s, "tflops": 2.0 * r["m"] * r["k"] * r["n"] / s / 1e12})
        del x, w
        advance()
    return out


def fp8_matmul_scale(gemm: list[dict], fp8_rows: list[dict], peaks: dict) -> float:
    """The profile's fp8_matmul_scale from measurements: the best FP8 GEMM's fraction of the fp8 peak over the best
    bf16 GEMM's fraction of the bf16 peak (the maximum achievable matmul FLOPS convention, each the best shape's),
    kept within the schema's (0, 2]."""
    best16 = max(r["tflops"] for r in gemm if r["dtype"] == "bf16") / peaks["bf16"]
    best8 = max(r["tflops"] for r in fp8_rows) / peaks["fp8"]
    return float(f"{min(best8 / best16, 2.0):.4g}")


def fp8_measurable(torch, device, base_profile) -> bool:
    """Whether calibrate measures FP8 GEMMs: a GPU with FP8 tensor cores (compute capability 8.9 and up: Ada,
    Hopper, Blackwell) and a base profile with an fp8 peak to measure against."""
    return (device.type == "cuda" and "fp8" in base_profile.peak_dense_tflops
            and "bf16" in base_profile.peak_dense_tflops
            and tuple(torch.cuda.get_device_capability(device)) >= (8, 9))


def _gpu_telemetry(torch, device):
    """A function that returns (SM clock MHz, power W, temperature C) of `device` from nvidia-smi
    (parallel_layers.telemetry.query_once), or None when nvidia-smi is not there or does not list the device."""
    if device.type != "cuda":
        return None
    from parallel_layers.telemetry import query_once
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    read = lambda: query_once(uuid)  # noqa: E731
    return read if read() is not None else None


def measure_sustained(torch, device, row: dict, dtype_name: str, seconds: float, window_s: float = 1.0) -> dict:
    """The GEMM `row` (m, k, n, its isolated `tflops` from measure_gemms) run back to back for `seconds`, timed in
    windows of about `window_s`: what a long training run sustains once clocks settle under the power and thermal
    limits, against the short isolated measurement the curves come from.  Each window's work is queued, the GPU's
    clock, power and temperature read (nvidia-smi) while it runs, then the window is timed (CUDA events).
    `fraction` = steady / isolated, steady = the median of the last third of the windows, at most 1."""
    from parallel_layers.telemetry import FIELDS as TELEMETRY_FIELDS

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(row["m"], row["k"], device=device, dtype=dtype, generator=gen)
    w = torch.randn(row["k"], row["n"], device=device, dtype=dtype, generator=gen)
    c = torch.empty(row["m"], row["n"], device=device, dtype=dtype)
    flops = 2.0 * row["m"] * row["k"] * row["n"]
    per_window = max(1, int(window_s / (flops / (row["tflops"] * 1e12))))
    cuda = device.type == "cuda"
    telemetry = _gpu_telemetry(torch, device)
    windows, t0 = [], time.perf_counter()
    while not windows or time.perf_counter() - t0 < seconds:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            w0 = time.perf_counter()
        for _ in range(per_window):
            torch.mm(x, w, out=c)
        if cuda:
            end.record()
        sample = telemetry() if telemetry else None  # read while the window's GEMMs run
        if cuda:
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            dt = time.perf_counter() - w0
        windows.append({"t_s": round(time.perf_counter() - t0, 3), "tflops": per_window * flops / dt / 1e12,
                        **(dict(zip(TELEMETRY_FIELDS, sample)) if sample else {})})
    del x, w, c
    steady = statistics.median(r["tflops"] for r in windows[len(windows) - max(1, len(windows) // 3):])
    return {"shape": {k: row[k] for k in ("m", "k", "n")}, "dtype": dtype_name, "seconds": seconds,
            "isolated_tflops": row["tflops"], "first_tflops": windows[0]["tflops"], "steady_tflops": steady,
            "fraction": min(1.0, steady / row["tflops"]), "windows": windows}


def sustained_note(sus: dict) -> str:
    """One line for the profile's sources: what measure_sustained ran and found."""
    ws = sus["windows"]
    s = sus["shape"]
    note = (f"sustained: {sus['dtype']} GEMM {s['m']}x{s['k']}x{s['n']} back to back for {sus['seconds']:g} s "
            f"({len(ws)} windows): first window {sus['first_tflops']:.1f} TFLOP/s, steady (median of the last third) "
            f"{sus['steady_tflops']:.1f}, isolated {sus['isolated_tflops']:.1f}: sustained_matmul_fraction "
            f"{sus['fraction']:.3g}")
    tel = [w for w in ws if "sm_mhz" in w]
    if tel:
        last = tel[len(tel) - max(1, len(tel) // 3):]
        note += (f"; SM clock {tel[0]['sm_mhz']:.0f} -> {statistics.median(w['sm_mhz'] for w in last):.0f} MHz, power "
                 f"{tel[0]['power_w']:.0f} -> {statistics.median(w['power_w'] for w in last):.0f} W, temperature "
                 f"{tel[0]['temp_c']:.0f} -> {statistics.median(w['temp_c'] for w in last):.0f} C (nvidia-smi)")
    return note


def attention_cases(on_gpu: bool, quick: bool) -> list[dict]:
    if on_gpu:
        seqs, tokens, heads, d = ((2048, 4096, 8192) if quick else (1024, 2048, 4096, 8192, 16384)), 16384, 32, 128
    else:
        seqs, tokens, heads, d = ((128, 256, 512) if quick else (256, 512, 1024, 2048)), (1024 if quick else 4096), 4, 64
    return [{"seq": s, "batch": max(1, tokens // s), "heads": heads, "head_dim": d} for s in seqs]


def measure_attention(torch, device, timer, cases, dtype_name, advance) -> list[dict]:
    import torch.nn.functional as F

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    out = []
    for c in cases:
        shape = (c["batch"], c["heads"], c["seq"], c["head_dim"])
        q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        g = torch.randn(shape, device=device, dtype=dtype)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(g)
            q.grad = k.grad = v.grad = None

        s = timer(step)
        fwd = 0.5 * 4 * c["batch"] * c["heads"] * c["seq"] ** 2 * c["head_dim"]
        out.append({**c, "dtype": dtype_name, "s": s, "tflops_causal": fwd * 3.5 / s / 1e12})
        del q, k, v, g
        advance()
    return out


def measure_copy(torch, device, timer, nbytes: int) -> float:
    """GB/s of a device-to-device copy, read + write bytes counted."""
    n = nbytes // 4
    src = torch.empty(n, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    s = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * n * 4 / s / GB


# The optimizer probe (measure_optimizer): parplan's runtime's after-backward step on one GPU under the
# master-weights recipe (parallel_layers.clip.scale_to_norm, then MasterAdamW's fused AdamW over fp32 masters and
# the copy back into the 16-bit parameters), timed on two sets of parameters: a few large tensors (the step's memory
# passes, which set optimizer_bandwidth_fraction) and many small ones (its cost per tensor, optimizer_host_per_tensor_s)
OPTIMIZER_PROBE = {"cuda": ((8, 1 << 25), (1024, 1024)), "cpu": ((4, 1 << 19), (256, 256))}  # (tensors, each's size)


def measure_optimizer(torch, device, timer) -> list[dict]:
    """{"tensors", "params", "s"} per OPTIMIZER_PROBE set: seconds of one clipped master-weights AdamW step."""
    from parallel_layers.clip import scale_to_norm
    from parallel_layers.precision import MasterAdamW
    from planner import ADAMW_BETAS, ADAMW_WEIGHT_DECAY

    rows = []
    for count, size in OPTIMIZER_PROBE[device.type]:
        params = [torch.nn.Parameter(torch.randn(size, device=device).to(torch.bfloat16)) for _ in range(count)]
        for p in params:
            p.main_grad = torch.randn(size, device=device) * 1e-3
        opt = MasterAdamW(params, offload=False, keep_master=True, lr=1e-4, betas=ADAMW_BETAS,
                          weight_decay=ADAMW_WEIGHT_DECAY, fused=True)
        groups = {(device, torch.float32, 1): [p.main_grad for p in params]}

        def step():
            scale_to_norm(groups, 1.0, device)
            opt.step()
        rows.append({"tensors": count, "params": count * size, "s": timer(step)})
        del opt, groups, params
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def solve_optimizer(rows: list[tuple[float, int, float]]) -> tuple[float, float]:
    """(optimizer_bandwidth_fraction f, optimizer_host_per_tensor_s h) from (passes' seconds at f = 1, tensors, seconds
    measured) rows, the cost model's form passes / f + tensors x h: least squares for (1/f, h) with 1/f >= 1 and
    h >= 0 (h negative: 0, and 1/f the median ratio)."""
    import numpy as np
    a = np.array([[p, n] for p, n, _ in rows], dtype=float)
    y = np.array([t for *_, t in rows])
    (inv_f, h), *_ = np.linalg.lstsq(a, y, rcond=None)
    if h < 0 or inv_f < 1:
        h = 0.0 if h < 0 else h
        inv_f = max(1.0, statistics.median((t - n * h) / p for p, n, t in rows))
    return 1.0 / inv_f, float(h)


def optimizer_fit(rows: list[dict], profile_data: dict) -> tuple[float, float]:
    """solve_optimizer over the probe's rows, their passes priced by the cost model (optimizer_time of the
    master-weights recipe and grad_clip_time, at f = 1) under the profile being written (its hbm_efficiency just
    measured)."""
    from cost_models.compute import grad_clip_time, optimizer_time
    from cost_models.hardware import constants_from_profile
    from planner.schema import HardwareProfile
    hw = constants_from_profile(HardwareProfile(**{**profile_data, "optimizer_bandwidth_fraction": 1.0,
                                                   "optimizer_host_per_tensor_s": 0.0}))
    priced = [(float(optimizer_time(r["params"], 0, "master-weights", hw, 1)
                     + grad_clip_time(r["params"], "master-weights", hw)), r["tensors"], r["s"]) for r in rows]
    return solve_optimizer(priced)


def optimizer_note(rows: list[dict], f: float, h: float) -> str:
    return ("optimizer step (clip + master-weights fused AdamW + copy to 16 bits): " + ", ".join(
        f"{r['tensors']} tensors of {r['params'] // r['tensors']:,} {r['s'] * 1e3:.2f} ms" for r in rows)
        + f": optimizer_bandwidth_fraction {f:.3g}, optimizer_host_per_tensor_s {h:.3g}")


def measure_host_link(torch, device, timer, nbytes: int) -> tuple[float, float]:
    """(host->device, device->host) GB/s of pinned-memory copies."""
    n = nbytes // 4
    host = torch.empty(n, dtype=torch.float32, pin_memory=True).fill_(1.0)
    dev = torch.empty(n, device=device, dtype=torch.float32)
    h2d = timer(lambda: dev.copy_(host, non_blocking=True))
    d2h = timer(lambda: host.copy_(dev, non_blocking=True))
    del host, dev
    return n * 4 / h2d / GB, n * 4 / d2h / GB


def _gather_into(dist):
    """all_gather_single / reduce_scatter_single where this torch has them (torch 2.13 deprecates the
    older all_gather_into_tensor / reduce_scatter_tensor, same arguments), else the older names."""
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return ag, rs


def _timed(torch, cuda: bool, fn) -> float:
    """Seconds one call of fn takes: CUDA events on a GPU, wall clock on a CPU."""
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _collective_worker(rank: int, world: int, port: int, sizes: list[int], result_path: str,
                       device_type: str = "cuda") -> None:
    """One rank of the collective benchmark (spawned): NCCL and CUDA events on GPUs, median of 10 after
    3 warm-ups.  device_type "cpu" runs the same sweep over gloo with wall-clock timing: the numbers
    mean nothing there, it is how the tests exercise this code without GPUs."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    else:
        torch.set_num_threads(1)
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    all_gather, reduce_scatter = _gather_into(dist)

    results = []
    try:
        for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
            for size in sizes:
                numel = max(world, size // 2 // world * world)
                buf = torch.ones(numel, device=dev, dtype=torch.bfloat16)
                if op == "all_reduce":
                    fn = lambda: dist.all_reduce(buf)  # noqa: E731
                elif op == "all_gather":
                    shard = torch.ones(numel // world, device=dev, dtype=torch.bfloat16)
                    fn = lambda: all_gather(buf, shard)  # noqa: E731
                elif op == "reduce_scatter":
                    shard = torch.empty(numel // world, device=dev, dtype=torch.bfloat16)
                    fn = lambda: reduce_scatter(shard, buf)  # noqa: E731
                else:
                    peer = rank ^ 1  # pairs (0,1), (2,3), ...; an odd last rank idles

                    def fn():
                        if peer >= world:
                            return
                        ops = [dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, buf2, peer)]
                        for req in dist.batch_isend_irecv(ops):
                            req.wait()
                    buf2 = torch.empty_like(buf)
                for _ in range(3):
                    fn()
                if cuda:
                    torch.cuda.synchronize(dev)
                dist.barrier()
                samples = [_timed(torch, cuda, fn) for _ in range(10)]
                t = torch.tensor([statistics.median(samples)], device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                nbytes = numel * 2
                n = world
                factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                          "reduce_scatter": (n - 1) / n, "send_recv": 1.0}[op]
                results.append({"op": op, "bytes": nbytes, "s": float(t.item()),
                                "busbw_gbytes_per_s": nbytes * factor / float(t.item()) / GB})
        if cuda:
            ov = overlap_slowdown(torch, dist, dev, n=8192, gemms=16, comm_bytes=256 << 20)
        else:
            ov = overlap_slowdown(torch, dist, dev, n=128, gemms=4, comm_bytes=max(sizes), reps=3)
        worst = torch.tensor([ov["slowdown"]], device=dev)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the step waits for the slowest rank
        results.append({"op": "overlap", **ov, "slowdown": float(worst.item())})
        if rank == 0:
            Path(result_path).write_text(json.dumps(results))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def overlap_slowdown(torch, dist, device, n: int = 2048, gemms: int = 8, comm_bytes: int = 64 << 20,
                     reps: int = 5) -> dict:
    """Compute slowdown while a collective runs beside it, on this rank: a train of `gemms` n x n x n
    matmuls (bf16 on a GPU, fp32 on a CPU) timed alone and again with asynchronous all-reduces of
    `comm_bytes` in flight over the default group for its whole length (NCCL runs them on its own
    stream; gloo on its own thread).  Median of `reps`; slowdown = beside / alone - 1, >= 0."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    buf = torch.ones(max(1, comm_bytes // a.element_size()), device=device, dtype=dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    timed = lambda fn: _timed(torch, cuda, fn)  # noqa: E731

    def train():
        for _ in range(gemms):
            torch.mm(a, b)

    def comm_once():
        dist.all_reduce(buf, async_op=True).wait()
        sync()

    train()
    comm_once()
    sync()
    dist.barrier()
    alone = statistics.median(timed(train) for _ in range(reps))
    t0 = time.perf_counter()
    comm_once()
    one_comm = max(time.perf_counter() - t0, 1e-6)
    in_flight = int(min(256, math.ceil(1.5 * alone / one_comm) + 1))  # keep the link busy past the train
    # every rank must issue the same number of collectives: each timed its own, so take the largest
    agreed = torch.tensor([in_flight], device=device, dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    in_flight = int(agreed.item())
    beside = []
    for _ in range(reps):
        dist.barrier()
        works = [dist.all_reduce(buf, async_op=True) for _ in range(in_flight)]
        beside.append(timed(train))
        for w in works:
            w.wait()
        sync()
    med = statistics.median(beside)
    return {"gemm_alone_s": alone, "gemm_beside_s": med, "all_reduces_in_flight": in_flight,
            "slowdown": max(0.0, med / alone - 1.0)}


def free_port() -> int:
    """A port the OS hands out as free now (released again: rank 0's TCPStore binds it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_on_a_free_port(worker, args_for_port, nprocs: int, start_method: str = "spawn") -> None:
    """torch's start_processes(worker, args=args_for_port(port), nprocs) on a free port.  The port is free when it is
    chosen, not when rank 0 binds it seconds later (the ranks import torch first): another job's connections pick
    ephemeral ports all the while, and one that takes this one makes rank 0's TCPStore fail with EADDRINUSE (CI,
    2026-12-06, the other test worker's gloo ranks).  Such a start, and only such a start, is tried again on a fresh
    port, up to PORT_TRIES starts."""
    import torch.multiprocessing as mp

    for attempt in range(PORT_TRIES):
        try:
            mp.start_processes(worker, args=args_for_port(free_port()), nprocs=nprocs, join=True,
                               start_method=start_method)
            return
        except mp.ProcessRaisedException as e:
            if attempt == PORT_TRIES - 1 or "EADDRINUSE" not in str(e):
                raise


def measure_collectives(world: int, quick: bool, device_type: str = "cuda", sizes: list[int] | None = None) -> list[dict]:
    """Bus bandwidth of all-reduce, all-gather, reduce-scatter and paired send/recv by message size on
    `world` local ranks (one per GPU), and the overlap probe; rank 0's list of rows."""
    if sizes is None:
        sizes = [8 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20] + ([] if quick else [1 << 30])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "collectives.json")
        spawn_on_a_free_port(_collective_worker, lambda port: (world, port, sizes, path, device_type), world)
        return json.loads(Path(path).read_text())


def apply_nics(data: dict, base_profile, ports, measured_fields: list[str]) -> str:
    """This node's NICs (planner.topology.node_network: the active RDMA ports, else the Ethernet interfaces that are
    up) against the base's inter-node rate a GPU: where their line rate over the profile's gpus_per_node is below it
    (topology.NIC_SHORTFALL), it is this node's inter_node.gbytes_per_s (efficiency and latency kept: the base's
    measurements of its network); at or above it (storage NICs count too) the base's is kept.  Returns the note."""
    from . import topology
    base = base_profile.inter_node.gbytes_per_s
    if not ports:
        return f"inter_node kept from {base_profile.name}: no active RDMA port or Ethernet speed under /sys/class"
    node_gbits, here = topology.nic_rate(ports, data["gpus_per_node"])
    said = (f"this node's NICs: {topology.describe_ports(ports)} active, {node_gbits:g} Gb/s, {here:.3g} GB/s a GPU "
            f"over {data['gpus_per_node']}")
    if here >= topology.NIC_SHORTFALL * base:
        return f"{said}: {base_profile.name}'s {base:g} GB/s a GPU across nodes kept"
    data["inter_node"] = {**data["inter_node"], "gbytes_per_s": float(f"{here:.4g}")}
    measured_fields.append("inter_node.gbytes_per_s")
    return (f"{said}, below {base_profile.name}'s {base:g}: inter_node.gbytes_per_s {here:.4g} (line rate; its "
            "efficiency and latency kept from the base" + (", measured over InfiniBand: NCCL's TCP sockets run slower"
                                                           if ports[0].kind == "TCP" else "") + ")")


def pair_measured(rows: list[dict], nv: dict, measured_fields: list[str]) -> float | None:
    """A bridged pair's own all-reduce into nv["bridge_efficiency"] (its largest message's bus bandwidth over the
    bridge's rate); that bus bandwidth, or None where the rows have no all-reduce."""
    ar = [r for r in rows if r["op"] == "all_reduce"]
    if not ar:
        return None
    busbw = max(ar, key=lambda r: r["bytes"])["busbw_gbytes_per_s"]
    nv["bridge_efficiency"] = _clamp_eff(busbw / nv["bridge_gbytes_per_s"])
    measured_fields.append("nvlink.bridge_efficiency")
    return busbw


def bridged_first_pair(topo, env: dict | None = None) -> bool:
    """Whether CUDA devices 0 and 1 here are NVLinked (measure_collectives(2) runs on them)."""
    from . import topology
    devices = (topology.visible_gpus(topo, env)[0] or [])[:2]
    return len(devices) == 2 and not topology.unbridged_pairs(topo, devices)


def apply_collectives(data: dict, coll: list[dict], base_profile, world: int, measured_fields: list[str],
                      topo=None, env: dict | None = None, pair_rows: list[dict] | None = None) -> str:
    """Write what the collective benchmark measured into the profile dict `data` (nvlink efficiency and
    latency, overlap_compute_slowdown when the overlap probe ran); returns the sources note.  topo: this node's
    `nvidia-smi topo -m` (planner.topology), which tells a base bridged in pairs whether the GPUs measured are: two
    not NVLinked measured the node's PCIe rate, and a node without any NVLink drops the base's bridges.  pair_rows:
    the collectives of CUDA devices 0 and 1 alone, where `coll` ran on more GPUs of a bridged node and those two are
    NVLinked: their all-reduce sets the bridge's efficiency."""
    ov = [r for r in coll if r["op"] == "overlap"]
    if ov:
        data["overlap_compute_slowdown"] = float(f"{min(1.0, ov[0]['slowdown']):.3g}")
        measured_fields.append("overlap_compute_slowdown")
    ar = [r for r in coll if r["op"] == "all_reduce"]
    big = max(ar, key=lambda r: r["bytes"])
    small = min(ar, key=lambda r: r["bytes"])
    nv = dict(data["nvlink"])
    # two GPUs of a node bridged in pairs (the base's nvlink.bridge_gbytes_per_s) are one pair: what they measured is
    # the pair's rate (the bridge's), not the rest of the node's, unless nvidia-smi shows these two not NVLinked
    bridge_note = ""
    if nv.get("bridge_gbytes_per_s") and topo is not None:
        from . import topology
        devices = (topology.visible_gpus(topo, env)[0] or [])[:world]
        if not any(topo.nvlinked(a, b) for a, b in topo.links):
            nv.pop("bridge_gbytes_per_s")
            nv.pop("bridge_efficiency", None)
            bridge_note = ("; nvidia-smi topo -m shows no NVLink between this node's GPUs: the base's bridged pairs "
                           "dropped (every group at the PCIe rate)")
        elif world == 2 and len(devices) == 2 and not topo.nvlinked(*devices):
            bridge_note = (f"; GPU{devices[0]}-GPU{devices[1]} are not NVLinked ({topo.link(*devices)}, nvidia-smi "
                           "topo -m): their rate is the node's PCIe rate, and the base's bridged pairs are kept")
    pair = world == 2 and bool(nv.get("bridge_gbytes_per_s")) and not bridge_note
    link = nv["bridge_gbytes_per_s"] if pair else base_profile.nvlink.gbytes_per_s
    nv["bridge_efficiency" if pair else "efficiency"] = _clamp_eff(big["busbw_gbytes_per_s"] / link)
    nv["latency_s"] = float(f"{small['s'] / (2 * (world - 1)):.3g}")
    # the base's rates by group size are another machine's: this one measured its whole node's group only
    by_size = nv.pop("efficiency_by_group_size", None)
    data["nvlink"] = nv
    measured_fields += ["nvlink.bridge_efficiency" if pair else "nvlink.efficiency", "nvlink.latency_s"]
    note = (f"{world} GPUs: all-reduce busbw {big['busbw_gbytes_per_s']:.0f} GB/s at {big['bytes'] / 2**20:.0f} MiB "
            f"/ {'bridge' if pair else 'link'} {link:g} GB/s; {small['bytes'] / 1024:.0f} KiB all-reduce "
            f"{small['s'] * 1e6:.1f} us over {2 * (world - 1)} ring steps; " + ", ".join(
                f"{op} {max((r for r in coll if r['op'] == op), key=lambda r: r['bytes'])['busbw_gbytes_per_s']:.0f}"
                for op in ("all_gather", "reduce_scatter", "send_recv")) + " GB/s")
    if by_size:
        note += (f"; the base's nvlink.efficiency_by_group_size dropped (a group of {world} measured here: every group "
                 "takes that rate)")
    note += bridge_note
    if nv.get("bridge_gbytes_per_s") and not bridge_note:
        apart = pair_measured(pair_rows, nv, measured_fields) if pair_rows and not pair else None
        if apart is not None:
            note += (f"; a bridged pair apart (CUDA devices 0 and 1): all-reduce busbw {apart:.0f} GB/s / bridge "
                     f"{nv['bridge_gbytes_per_s']:g} GB/s: nvlink.bridge_efficiency {nv['bridge_efficiency']:g}")
        else:
            note += ("; one bridged pair measured: the rest of the node's groups keep the base's nvlink.efficiency"
                     if pair else "; the base's bridged pairs (nvlink.bridge_efficiency) kept: a pair was not measured "
                     "alone")
    if ov:
        note += (f"; GEMM train {ov[0]['gemm_alone_s'] * 1e3:.1f} ms alone, {ov[0]['gemm_beside_s'] * 1e3:.1f} ms beside "
                 f"{ov[0]['all_reduces_in_flight']} all-reduces: overlap_compute_slowdown "
                 f"{data['overlap_compute_slowdown']:g} (slowest rank)")
    return note


HOST_BLOCKS = (2, 10)  # block counts of the two host-dispatch runs; their difference isolates one block
HOST_MODES = ("none", "selective", "full", "selective-op")
HOST_FP8_MODES = ("none", "full")  # the probe again with FP8 linears (host_block_fp8_s), where FP8 is measured
HOST_REPEATS = 3  # pairs of runs per mode: the median of their estimates, and their spread, which says how steady the host was
HOST_NOISY = 0.25  # a mode whose repeats spread more than this (max - min over median) gets a note


# the probe's block: a llama so small (hidden 256, 128 tokens, one sample) that every kernel is launch-bound
PROBE_SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "seq_len": 128}
# the probe as a mixture of experts (parplan's runtime runs such a model's blocks eagerly): the same attention, experts
# of ffn 256, top 2, at two expert counts; the line through the two is host_moe_block_s + experts x host_moe_expert_s
MOE_PROBE_EXPERTS = (4, 16)
MOE_PROBE_SHAPE = {"ffn_hidden": 256, "experts_per_token": 2}
HOST_MOE_MODES = ("none", "full")


def _host_probe_plan(blocks: int, recompute: str, device_type: str, shape: dict | None = None, fp8: bool = False):
    """The probe's plan: `blocks` llama blocks of PROBE_SHAPE, or of `shape` where given (any of its keys;
    benchmarks/host_probe_width.py runs the probe at a launch's own width); fp8: its linears in FP8 (every size a
    multiple of 16, as the FP8 GEMM needs; amp on CPU, whose runs compute in fp32)."""
    from .core import recommend
    from .schema import ModelSpec
    from .search import Pins

    s = {**PROBE_SHAPE, **(shape or {})}
    moe = {k: s[k] for k in ("experts", "experts_per_token") if s.get("experts")}  # MOE_PROBE_SHAPE's
    spec = ModelSpec(arch="llama", layers=blocks, hidden=s["hidden"], heads=s["heads"], kv_heads=s["kv_heads"],
                     ffn_hidden=s["ffn_hidden"], vocab=1024, name=f"host-probe-{blocks}", **moe)
    return recommend(spec, gpus=1, seq_len=s["seq_len"], global_batch_size=1, fp8=fp8,
                     precision="master-weights" if device_type == "cuda" else ("amp" if fp8 else "fp32"),
                     pins=Pins(tp=1, pp=1, dp=1, cp=1, mbs=1, zero=0, recompute=recompute, offload="none"),
                     suggest=False)


def host_block_estimate(pairs: list[dict],
                        blocks: tuple[int, int] = HOST_BLOCKS) -> tuple[float, float | None, float | None]:
    """(host seconds per block, forward share, spread) of one recompute mode from its repeated pairs of runs.
    Each pair holds the median step time of the HOST_BLOCKS runs (`t`) and, where the reports carry them, the
    median forward dispatch (`f`) and whole dispatch (`d`).  A pair's estimate is the step-time difference over
    the block difference; the result is the median over pairs, so one pair disturbed by the host (another
    process, a clock change) does not set it.  The share is the median of the pairs' (f difference / d
    difference) that lie in (0, 1); the spread is (max - min) / median of the estimates (None for one pair).
    blocks: the pair's block counts (HOST_BLOCKS unless a caller probes others)."""
    per_block = blocks[1] - blocks[0]
    ests = [max(0.0, (p["t"][1] - p["t"][0]) / per_block) for p in pairs]
    shares = [(p["f"][1] - p["f"][0]) / (p["d"][1] - p["d"][0]) for p in pairs
              if p.get("f") and p.get("d") and p["d"][1] > p["d"][0]]
    shares = [x for x in shares if 0 < x < 1]
    est = statistics.median(ests)
    spread = (max(ests) - min(ests)) / est if len(ests) > 1 and est > 0 else None
    return est, (statistics.median(shares) if shares else None), spread


def measure_host_block(device_type: str, steps: int = 12, advance=None, modes=HOST_MODES,
                       shares: dict | None = None, repeats: int = HOST_REPEATS,
                       spread: dict | None = None, shape: dict | None = None,
                       blocks: tuple[int, int] = HOST_BLOCKS, fp8: bool = False,
                       compiled: bool | None = None) -> dict[str, float]:
    """Host seconds to dispatch one block's forward + backward in parplan's own runtime, per recompute
    mode: the runtime (torchrun, --compile on cuda, as `parplan launch` runs it) trains the tiny probe
    with 2 and with 10 blocks, `repeats` times in turn; each pair gives (median step time difference) / 8, and
    the mode's value is the median over the pairs (host_block_estimate).  The per-step costs (embedding,
    head, optimizer launch, synchronisation) cancel in the difference.  All the runs share one
    process (`parallel_layers.probe`): one start-up and one compile per mode instead of one per run.  `shares`,
    if given, gets each mode's forward share of that dispatch (the profile's host_forward_share): the difference
    of the runs' forward dispatch (`host_forward_s`) over the difference of their whole dispatch, where both are
    in the reports and the share lies in (0, 1).  `spread`, if given, gets each mode's spread over its pairs.
    `shape`: the probe's block other than PROBE_SHAPE (_host_probe_plan); `blocks`: other block counts than
    HOST_BLOCKS (benchmarks/host_probe_width.py asks whether a block costs the same at a launch's 24); fp8: the
    probe's linears in FP8 (host_block_fp8_s); compiled: False runs the blocks uncompiled on a GPU too
    (host_block_eager_s; None: compiled on cuda, as launch runs a dense model)."""
    import subprocess

    from .launch import job_env

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="parplan-host-") as tmp:
        runs = [(mode, rep, n, Path(tmp) / f"report-{mode}-{rep}-{n}.json")
                for mode in modes for rep in range(repeats) for n in blocks]
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                "-m", "parallel_layers.probe", "--steps", str(steps), "--device", device_type]
        if device_type == "cuda" if compiled is None else compiled:
            argv.append("--compile")  # (a mixture of experts' blocks run eagerly all the same, as launch runs them)
        if (shape or {}).get("experts"):
            argv.append("--moe-balanced-routing")  # every expert its share of the tokens, as the cost model counts
        for mode, rep, n, report in runs:
            plan_path = Path(tmp) / f"plan-{mode}-{rep}-{n}.json"
            plan_path.write_text(_host_probe_plan(n, mode, device_type, shape, fp8).model_dump_json())
            argv += ["--plan", str(plan_path), "--report", str(report)]
        log = Path(tmp) / "probe.log"
        with open(log, "w") as f:
            job = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=job_env(device_type))
            done = 0
            while True:  # advance the caller's progress bar as each run's report appears
                running = job.poll() is None
                finished = sum(r.exists() for *_, r in runs)
                for _ in range(finished - done if advance else 0):
                    advance()
                done = finished
                if not running:
                    break
                time.sleep(0.2)
        missing = [f"{mode}, {n} blocks" for mode, _, n, r in runs if not r.exists()]
        if job.returncode != 0 or missing:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise CalibrationError(f"host-dispatch probe ({missing[0] if missing else 'exit ' + str(job.returncode)}) "
                                   f"failed: {' | '.join(tail)}")
        for mode in modes:
            pairs = []
            for rep in range(repeats):
                pair: dict = {"t": [], "f": [], "d": []}
                for n in blocks:
                    # the report's medians over its timed steps (None where a step lacks the phase)
                    med = json.loads((Path(tmp) / f"report-{mode}-{rep}-{n}.json").read_text())["median"]
                    pair["t"].append(med["step_time_s"])
                    if med["host_forward_s"] is not None and med["host_dispatch_s"] is not None:
                        pair["f"].append(med["host_forward_s"])
                        pair["d"].append(med["host_dispatch_s"])
                if len(pair["f"]) != len(blocks):
                    pair["f"] = pair["d"] = None
                pairs.append(pair)
            out[mode], share, sp = host_block_estimate(pairs, blocks)
            if shares is not None and share is not None:
                shares[mode] = share
            if spread is not None and sp is not None:
                spread[mode] = sp
    return out


def moe_host_line(at: dict[int, dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(host_moe_block_s, host_moe_expert_s) from the MoE probe's dispatch per block at two expert counts (at:
    experts -> mode -> seconds): the line through the two points, slope and intercept clamped at zero (a host
    whose larger probe read faster, by noise, gets no slope and the two points' mean)."""
    lo, hi = sorted(at)
    block: dict[str, float] = {}
    expert: dict[str, float] = {}
    for mode in at[lo]:
        slope = max(0.0, (at[hi][mode] - at[lo][mode]) / (hi - lo))
        base = (at[lo][mode] + at[hi][mode]) / 2 if slope == 0 else at[lo][mode] - lo * slope
        block[mode], expert[mode] = max(base, 0.0), slope
    return block, expert


def measure_moe_host_block(device_type: str, advance=None, steps: int = 12,
                           repeats: int = HOST_REPEATS) -> tuple[dict[str, float], dict[str, float], str | None]:
    """(host_moe_block_s, host_moe_expert_s, note): the probe as a mixture of experts (MOE_PROBE_SHAPE) at each of
    MOE_PROBE_EXPERTS, its dispatch per block as measure_host_block measures it (HOST_MOE_MODES); a probe that fails
    leaves both unmeasured, with a note, instead of failing the calibration."""
    try:
        at = {e: measure_host_block(device_type, steps=steps, advance=advance, modes=HOST_MOE_MODES, repeats=repeats,
                                    shape={**MOE_PROBE_SHAPE, "experts": e})
              for e in MOE_PROBE_EXPERTS}
    except CalibrationError as e:
        return {}, {}, f"host dispatch of a mixture of experts' block not measured ({str(e)[:200]})"
    block, expert = moe_host_line(at)
    return block, expert, None


def measure_eager_host_block(device_type: str, advance=None, steps: int = 12) -> tuple[dict[str, float], str | None]:
    """(host_block_eager_s, note): the dense probe with its blocks uncompiled (HOST_MOE_MODES), as parplan's runtime
    runs a mixture of experts' dense blocks and a plan without fused elementwise work; a probe that fails leaves it
    unmeasured, with a note."""
    try:
        return measure_host_block(device_type, steps=steps, advance=advance, modes=HOST_MOE_MODES,
                                  compiled=False), None
    except CalibrationError as e:
        return {}, f"host dispatch of an uncompiled block not measured ({str(e)[:200]})"


def measure_fp8_host_block(device_type: str, advance=None, steps: int = 12) -> tuple[dict[str, float], str | None]:
    """(host_block_fp8_s, note): the probe again with its linears in FP8 (HOST_FP8_MODES); a probe that fails (a
    torch whose FP8 GEMM does not run here) leaves it unmeasured, with a note, instead of failing the calibration."""
    try:
        return measure_host_block(device_type, steps=steps, advance=advance, modes=HOST_FP8_MODES, fp8=True), None
    except CalibrationError as e:
        return {}, f"host dispatch with FP8 linears not measured ({str(e)[:200]})"


def _host_field(name: str, what: str, old: dict | None, measured: dict) -> tuple[dict, str | None]:
    """A profile's host field measured by a probe of its own (host_block_fp8_s, the MoE probe's two; what: what that
    probe runs), after the host was measured again: what was measured now, else nothing (another host's dispatch
    does not carry, as host_block_s does not), with a note when a value was dropped."""
    if measured:
        return {k: float(f"{v:.4g}") for k, v in measured.items()}, None
    if old:
        return {}, f"{name} dropped: the base's was measured on another host, and {what} was not measured here"
    return {}, None


def apply_moe_host(data: dict, block: dict, expert: dict, eager: dict, measured_fields: list | None = None) -> list[str]:
    """Write the MoE probe's line (measure_moe_host_block) and the uncompiled dense probe (measure_eager_host_block)
    into the profile dict: host_moe_block_s, host_moe_expert_s and host_block_eager_s, or, unmeasured, the base's
    dropped (another host's); returns the notes."""
    notes = []
    for name, got in (("host_moe_block_s", block), ("host_moe_expert_s", expert), ("host_block_eager_s", eager)):
        data[name], note = _host_field(name, "a mixture of experts' block", data.get(name), got)
        notes += [note] if note else []
        if got and measured_fields is not None:
            measured_fields.append(name)
    return notes


def moe_host_text(block: dict, expert: dict, eager: dict) -> str:
    """The sources' words for the uncompiled probes: the dense block's and the MoE probe's line."""
    out = ("; uncompiled (host_block_eager_s) " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in eager.items())
           if eager else "")
    if block:
        out += ("; a mixture of experts' block, eager (the probe with " + " and ".join(map(str, MOE_PROBE_EXPERTS)) +
                f" experts of ffn {MOE_PROBE_SHAPE['ffn_hidden']}, top {MOE_PROBE_SHAPE['experts_per_token']}, "
                "balanced routing): " +
                ", ".join(f"{k} {block[k] * 1e3:.2f} ms + {expert[k] * 1e3:.3f} ms an expert" for k in block))
    return out


def noisy_host_note(spread: dict) -> str | None:
    """A note naming the modes whose repeated pairs spread past HOST_NOISY, or None."""
    bad = {k: v for k, v in spread.items() if v > HOST_NOISY}
    if not bad:
        return None
    return ("host dispatch varied over its repeats (" + ", ".join(f"{k} {v:.0%}" for k, v in bad.items()) +
            f", max - min over median of {HOST_REPEATS} pairs): a busy or unsteady host; the median is kept -- "
            "re-measure with `parplan calibrate --host-only` when the machine is idle")


def _remeasured_shares(old: dict | None, remeasured: dict, shares: dict) -> dict:
    """A profile's host_forward_share after its host dispatch was measured again for the modes in `remeasured`: a
    share measured beside other dispatch times (another host's) does not carry, so those modes keep only what this
    measurement found (`shares`); the other modes keep theirs."""
    return {**{k: v for k, v in (old or {}).items() if k not in remeasured},
            **{k: float(f"{v:.3g}") for k, v in shares.items()}}


def _pick_device(torch, device: str):
    """cuda for auto/cuda, the CPU only when asked for by name: a machine with no GPU is refused under
    auto (a CPU profile is no measurement of any GPU, and it took 100 s to write one nobody asked for)."""
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if device == "auto":
            raise CalibrationError(NO_GPU)
        raise CalibrationError("--device cuda: no CUDA device is visible to torch here -- fix: run it on the GPU "
                               "node, or pass --device cpu for a test-only self-calibration of this CPU")
    return torch.device("cuda", torch.cuda.current_device())


def _open_device(device: str):
    """(torch, the device, whether it is a GPU, its name) for --device auto/cuda/cpu."""
    if device not in ("auto", "cuda", "cpu"):
        raise CalibrationError(f"--device must be one of auto, cuda, cpu; got {device!r}")
    try:
        import torch
    except ImportError as e:
        raise CalibrationError(f"calibrate needs torch ({e})") from None
    dev = _pick_device(torch, device)
    on_gpu = dev.type == "cuda"
    return torch, dev, on_gpu, torch.cuda.get_device_name(dev) if on_gpu else cpu_name()


class PhaseClock:
    """Seconds per calibrate phase (the bar is the whole command under 5 minutes; a GPU with FP8 tensor cores adds
    FP8 GEMM rows and an FP8 host probe, so the profile and the summary say where the time went): each call
    charges the time since the previous one (or since `t0`) to `name`."""

    def __init__(self, t0: float):
        self.last = t0
        self.phases: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now

    @staticmethod
    def render(phases: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.0f} s" if v >= 1 else f"{k} {v:.1f} s" for k, v in phases.items())

    def text(self) -> str:
        return self.render(self.phases)


def calibrate_device(out: str | None = None, base: str | None = None, device: str = "auto",
                     quick: bool = False, console=None, sustained_s: float = 0.0):
    """Measure the local device and write a calibrated profile. Returns (path, profile, summary).  With
    `sustained_s` > 0 the best GEMM is also run back to back for that long (measure_sustained), last, and
    sustained_matmul_fraction is what it sustained over its isolated time; otherwise that field is kept from
    the base profile."""
    if not 0 <= sustained_s <= 3600:
        raise CalibrationError(f"--sustained must be between 0 and 3600 seconds; got {sustained_s:g}")
    t_start = time.perf_counter()
    torch, dev, on_gpu, device_name = _open_device(device)
    console = console or _console()
    if not on_gpu:
        console.print(cpu_warning(), style="bold red", markup=False, highlight=False, soft_wrap=True)
    notes: list[str] = []
    if base is None:
        base, matched = base_for_device(device_name) if on_gpu else (DEFAULT_BASE, False)
        if on_gpu and not matched:
            notes.append(f"no shipped profile matches {device_name!r}; base {DEFAULT_BASE} (give --base)")
        elif on_gpu and any(w in device_name.lower() for w in ("pcie", "nvl")):
            notes.append(f"{device_name!r} is not the SXM part of base {base}: efficiencies are relative to the SXM "
                         "datasheet peak and bandwidth; give --base with a matching profile for exact fractions")
    base_profile = _load_base(base)
    path = check_out_path(out, _calibrated_name(base_profile.name), base_file(base), "-recalibrated", console)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    world = torch.cuda.device_count() if on_gpu else 0
    gemm_rows = gemm_shapes(on_gpu, quick)
    gemm_dtypes = [d for d in (("bf16",) if quick else ("bf16", "fp16")) if d in base_profile.peak_dense_tflops] \
        if on_gpu else ["fp32"]
    if on_gpu and not gemm_dtypes:
        raise CalibrationError(f"base profile {base_profile.name} lists no bf16/fp16 peak to measure against")
    attn_cases = attention_cases(on_gpu, quick)
    attn_dtype = gemm_dtypes[0]
    if on_gpu:
        timer = _Timer(torch, dev, warmup=3, reps=10 if not quick else 5, sample_s=2e-3)
    else:
        timer = _Timer(torch, dev, warmup=1, reps=3, sample_s=2e-3 if quick else 1e-2)
    fp8_on = fp8_measurable(torch, dev, base_profile)  # (gemm_dtypes then hold bf16: the base lists its peak)
    host_runs = len(HOST_MODES) * len(HOST_BLOCKS) * HOST_REPEATS if on_gpu else 0
    fp8_host_runs = len(HOST_FP8_MODES) * len(HOST_BLOCKS) * HOST_REPEATS if on_gpu and fp8_on else 0
    moe_host_runs = ((len(MOE_PROBE_EXPERTS) + 1) * len(HOST_MOE_MODES) * len(HOST_BLOCKS) * HOST_REPEATS
                     if on_gpu else 0)  # the MoE probe's two expert counts and the uncompiled dense probe
    total = len(gemm_rows) * (len(gemm_dtypes) + fp8_on) + len(attn_cases) + 2 + (1 if on_gpu else 0) \
        + (1 if world >= 2 else 0) + host_runs + fp8_host_runs + moe_host_runs + (1 if sustained_s else 0)
    fp8_rows: list[dict] = []

    gemm: list[dict] = []
    attn: list[dict] = []
    coll: list[dict] = []
    pair_coll: list[dict] = []  # a bridged pair's collectives, measured apart on a bridged base's node of 3+ GPUs
    topo = None  # this node's `nvidia-smi topo -m`, read where the base bridges its cards in pairs
    copy_gbps = h2d = d2h = None
    host_block: dict[str, float] = {}
    host_block_fp8: dict[str, float] = {}
    moe_block: dict[str, float] = {}
    moe_expert: dict[str, float] = {}
    eager_block: dict[str, float] = {}
    host_share: dict[str, float] = {}
    host_spread: dict[str, float] = {}
    lap = PhaseClock(t_start)
    lap("start-up")
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console, transient=False) as prog:
        task = prog.add_task(f"calibrating {device_name}", total=total)
        adv = lambda: prog.advance(task)  # noqa: E731
        for dt in gemm_dtypes:
            prog.update(task, description=f"GEMM {dt} ({len(gemm_rows)} shapes)")
            gemm += measure_gemms(torch, dev, timer, gemm_rows, dt, adv)
            lap(f"GEMM {dt}")
        if fp8_on:
            prog.update(task, description=f"GEMM fp8 ({len(gemm_rows)} shapes, torch._scaled_mm)")
            try:
                fp8_rows = measure_gemms(torch, dev, timer, gemm_rows, "fp8", adv)
            except (RuntimeError, TypeError) as e:  # a torch or cuBLASLt without this FP8 GEMM: the rest still counts
                notes.append(f"FP8 GEMMs not measured ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
            lap("GEMM fp8")
        prog.update(task, description=f"attention {attn_dtype}")
        attn = measure_attention(torch, dev, timer, attn_cases, attn_dtype, adv)
        lap("attention")
        prog.update(task, description="device copy")
        copy_gbps = measure_copy(torch, dev, timer, (1 << 30) if on_gpu else (64 << 20))
        adv()
        lap("device copy")
        prog.update(task, description="optimizer step (clip + master-weights AdamW)")
        opt_rows = measure_optimizer(torch, dev, timer)
        adv()
        lap("optimizer step")
        if on_gpu:
            prog.update(task, description="host link")
            h2d, d2h = measure_host_link(torch, dev, timer, 256 << 20)
            adv()
            lap("host link")
            if world >= 2:
                prog.update(task, description=f"collectives on {world} GPUs")
                torch.cuda.empty_cache()
                coll = measure_collectives(world, quick)
                adv()
                if base_profile.nvlink.bridge_gbytes_per_s:  # which of this node's GPUs the bridges join
                    from .topology import read_topology
                    topo, why = read_topology()
                    if topo is None:
                        notes.append(f"the base's bridged pairs taken as this node's: {why}")
                    elif world > 2 and bridged_first_pair(topo):
                        # the whole node's ring measured PCIe; its first two GPUs, a bridged pair, the bridge
                        prog.update(task, description="collectives on one bridged pair")
                        pair_coll = measure_collectives(2, quick)
                lap("collectives")
            prog.update(task, description=f"host dispatch per block (parplan's runtime, {host_runs} short runs)")
            torch.cuda.empty_cache()
            host_block = measure_host_block("cuda", advance=adv, shares=host_share, spread=host_spread)
            notes += [n for n in (noisy_host_note(host_spread),) if n]
            from parallel_layers.host_speed import dispatch_probe
            probe = dispatch_probe(dev)  # what launch reports record of their host too (a few ms)
            launch_us = probe.get("probe_cuda_launch_us")
            notes.append(f"host dispatch probe (parallel_layers.host_speed, as launch reports record it): "
                         f"{probe['probe_cpu_op_us']:g} us a CPU op, "
                         + (f"{launch_us:g} us a kernel launch" if launch_us is not None else "kernel launch not timed")
                         + f" on a {cpu_name()} host")
            lap("host dispatch")
            if fp8_host_runs:
                prog.update(task, description=f"host dispatch per block, FP8 linears ({fp8_host_runs} short runs)")
                host_block_fp8, note = measure_fp8_host_block("cuda", adv)
                notes += [note] if note else []
                lap("host dispatch fp8")
            prog.update(task, description=f"host dispatch per block, uncompiled and a mixture of experts "
                                          f"({moe_host_runs} short runs)")
            eager_block, note = measure_eager_host_block("cuda", adv)
            moe_block, moe_expert, note2 = measure_moe_host_block("cuda", adv)
            notes += [n for n in (note, note2) if n]
            lap("host dispatch eager and moe")
        sustained = None
        if sustained_s:
            best_row = max((r for r in gemm if r["dtype"] == gemm_dtypes[0]), key=lambda r: r["tflops"])
            prog.update(task, description=f"sustained GEMM for {sustained_s:g} s (clocks under the power limit)")
            sustained = measure_sustained(torch, dev, best_row, gemm_dtypes[0], sustained_s)
            sustained["fraction"] = float(f"{sustained['fraction']:.4g}")  # as the profile stores it, and the note says
            adv()
            lap("sustained GEMM")
        prog.update(task, description="done")

    data = base_profile.model_dump(mode="json")
    measured_fields = []
    if on_gpu:
        peaks = base_profile.peak_dense_tflops
    else:
        cpu_peak = max(r["tflops"] for r in gemm)
        peaks = {k: cpu_peak for k in sorted(set(base_profile.peak_dense_tflops) | {"bf16", "fp16", "fp32"})}
        data["peak_dense_tflops"] = {k: float(f"{v:.6g}") for k, v in peaks.items()}
        measured_fields.append("peak_dense_tflops")
    points = [(2.0 * r["m"] * r["k"] * r["n"] / 1e9, r["tflops"] / peaks[r["dtype"]]) for r in gemm]
    data["matmul_efficiency_curve"] = _round_curve(binned_curve(points))
    attn_points = sorted((float(r["seq"]), r["tflops_causal"] / peaks[r["dtype"]]) for r in attn)
    smooth = isotonic_increasing([e for _, e in attn_points], [1.0] * len(attn_points))
    data["attention_efficiency_curve"] = _round_curve(list(zip([s for s, _ in attn_points], smooth)))
    measured_fields += ["matmul_efficiency_curve", "attention_efficiency_curve"]
    if on_gpu:
        data["hbm_efficiency"] = _clamp_eff(copy_gbps / base_profile.hbm_gbytes_per_s)
        measured_fields.append("hbm_efficiency")
        data["host_link_gbytes_per_s"] = float(f"{min(h2d, d2h):.4g}")
        measured_fields.append("host_link_gbytes_per_s")
        data["host_block_s"] = {k: float(f"{v:.4g}") for k, v in host_block.items()}
        measured_fields.append("host_block_s")
        data["host_forward_share"] = _remeasured_shares(data.get("host_forward_share"), host_block, host_share)
        if host_share:
            measured_fields.append("host_forward_share")
        data["host_block_fp8_s"], fp8_note = _host_field("host_block_fp8_s", "FP8", data.get("host_block_fp8_s"), host_block_fp8)
        notes += [fp8_note] if fp8_note else []
        if host_block_fp8:
            measured_fields.append("host_block_fp8_s")
        notes += apply_moe_host(data, moe_block, moe_expert, eager_block, measured_fields)
        # what the CUDA allocator can use (cudaDeviceProp.totalGlobalMem): below nvidia-smi's memory.total, which
        # counts memory the driver keeps (an H100 80GB: about 79.1 GiB against 81,559 MiB)
        data["hbm_gbytes"] = round(device_capacity_bytes() / 1e9, 2)
        measured_fields.append("hbm_gbytes")
    else:
        data["hbm_gbytes_per_s"] = float(f"{copy_gbps:.4g}")
        data["hbm_efficiency"] = 1.0
        measured_fields += ["hbm_gbytes_per_s", "hbm_efficiency"]
        notes.append("cpu: host link not measured (no device); base value kept")
        notes.append("cpu: host dispatch per block not measured (a GPU measurement; measure_host_block('cpu') exists for tests)")
    f_opt, h_opt = optimizer_fit(opt_rows, data)  # (after hbm_efficiency: the passes are priced at the measured rate)
    data["optimizer_bandwidth_fraction"] = float(f"{f_opt:.4g}")
    data["optimizer_host_per_tensor_s"] = float(f"{h_opt:.4g}")
    measured_fields += ["optimizer_bandwidth_fraction", "optimizer_host_per_tensor_s"]
    notes.append(optimizer_note(opt_rows, f_opt, h_opt))
    if fp8_rows:
        data["fp8_matmul_scale"] = fp8_matmul_scale(gemm, fp8_rows, peaks)
        measured_fields.append("fp8_matmul_scale")
    elif "fp8" in base_profile.peak_dense_tflops:
        notes.append(f"fp8_matmul_scale kept from {base_profile.name} ({base_profile.fp8_matmul_scale:g})" +
                     ("" if fp8_on else ": FP8 GEMMs are measured on GPUs with FP8 tensor cores (compute capability "
                                        "8.9 and up)"))
    net_note = None
    if coll:
        net_note = apply_collectives(data, coll, base_profile, world, measured_fields, topo, pair_rows=pair_coll)
    else:
        why = "one GPU" if on_gpu else "cpu"
        notes.append(f"{why}: network not measured; nvlink, " + ("" if on_gpu else "inter_node ") +
                     f"and overlap_compute_slowdown kept from {base_profile.name}")
    if on_gpu:
        from .topology import node_network
        notes.append(apply_nics(data, base_profile, node_network(), measured_fields))
    if sustained:
        data["sustained_matmul_fraction"] = sustained["fraction"]
        measured_fields.append("sustained_matmul_fraction")
        notes.append(("inter_node's efficiency and latency, " if on_gpu else "inter_node, hbm_gbytes, ") +
                     f"memory_reserve_gbytes and host memory kept from {base_profile.name} (inter-node needs several "
                     f"nodes); sustained_matmul_fraction {base_profile.sustained_matmul_fraction:g} -> "
                     f"{data['sustained_matmul_fraction']:g}, measured (--sustained)")
    else:
        notes.append(("inter_node's efficiency and latency, " if on_gpu else "inter_node, hbm_gbytes, ") +
                     "memory_reserve_gbytes, "
                     f"sustained_matmul_fraction and host memory kept from {base_profile.name} (inter-node needs several "
                     "nodes; sustained fraction: `parplan calibrate --sustained SECONDS`, or --from-run)")

    elapsed = time.perf_counter() - t_start
    method = (f"CUDA events, median of {timer.reps} after {timer.warmup} warm-ups" if on_gpu
              else f"perf_counter, median of {timer.reps} after {timer.warmup} warm-up")
    cmd = f"{TOOL} --device {dev.type} --base {base_profile.name}" + (" --quick" if quick else "") + \
        (f" --sustained {sustained_s:g}" if sustained_s else "")
    if on_gpu:
        data["measured"] = (f"{_today()}: {device_name} ({world} visible) on a {cpu_name()} host, torch "
                            f"{torch.__version__}, {cmd}: "
                            f"{', '.join(measured_fields)} ({method}; {elapsed:.0f} s: {lap.text()})")
    else:
        data["measured"] = (f"{_today()}: CPU SELF-CALIBRATION {TEST_ONLY_MARK} ({device_name}, "
                            f"{torch.get_num_threads()} threads), torch {torch.__version__}, {cmd} (the CPU asked for "
                            f"by name): peak = best fp32 "
                            f"GEMM measured ({peaks['fp32'] * 1e3:.1f} GFLOP/s) for every dtype, hbm = device copy "
                            f"bandwidth; not a GPU measurement, and not a {base_profile.name}: do not plan real runs "
                            f"with it ({method}; {elapsed:.0f} s: {lap.text()})")
    data["name"] = _calibrated_name(base_profile.name)
    data["description"] = (f"{base_profile.description} -- calibrated on {device_name}".strip(" -") if on_gpu else
                           f"CPU SELF-CALIBRATION FOR TESTING ONLY on {device_name} (fields it does not measure kept "
                           f"from {base_profile.name}); not a GPU profile")
    best = {dt: max(r["tflops"] for r in gemm if r["dtype"] == dt) for dt in gemm_dtypes}
    src = (f"[calibrate] {cmd} ({_today()}, {device_name}): {len(gemm)} GEMMs "
           f"({', '.join(f'{dt} best {v:.1f} TFLOP/s' for dt, v in best.items())}) binned into {len(data['matmul_efficiency_curve'])} "
           f"points; attention {attn_dtype} seq {', '.join(str(c['seq']) for c in attn_cases)}; device copy {copy_gbps:.1f} GB/s")
    if fp8_rows:
        src += (f"; {len(fp8_rows)} FP8 GEMMs (torch._scaled_mm, e4m3, per-tensor scales) best "
                f"{max(r['tflops'] for r in fp8_rows):.1f} TFLOP/s: fp8_matmul_scale {data['fp8_matmul_scale']:g}")
    if on_gpu:
        src += f"; pinned H2D {h2d:.1f} / D2H {d2h:.1f} GB/s"
        src += ("; host dispatch per block fwd+bwd (runtime, compiled, probe of hidden 256 x 128 tokens, "
                f"{HOST_BLOCKS[1]} minus {HOST_BLOCKS[0]} blocks, median of {HOST_REPEATS} pairs): " +
                ", ".join(f"{k} {v * 1e3:.2f} ms" + (f" (spread {host_spread[k]:.0%})" if k in host_spread else "")
                          for k, v in host_block.items()) +
                ("; the forward's share of it " + ", ".join(f"{k} {v:.2f}" for k, v in host_share.items())
                 if host_share else "") +
                ("; with FP8 linears (host_block_fp8_s) " + ", ".join(f"{k} {v * 1e3:.2f} ms"
                                                                      for k, v in host_block_fp8.items())
                 if host_block_fp8 else "") + moe_host_text(moe_block, moe_expert, eager_block))
    if net_note:
        src += f"; {net_note}"
    if sustained:
        src += f"; {sustained_note(sustained)}"
    kept = [x for x in data.get("sources") or []
            if not (sustained and x.startswith("[fitted] sustained_matmul_fraction"))  # measured now, not the fit
            and not (fp8_rows and x.startswith("[fp8-eff]"))]  # the same for the FP8 GEMMs' ratio
    data["sources"] = kept + [src] + [f"[calibrate] {n}" for n in notes]

    from .schema import HardwareProfile
    profile = HardwareProfile(**data)
    write_profile(profile, path)
    summary = {"device": device_name, "elapsed_s": elapsed, "phases_s": dict(lap.phases), "gemm": gemm,
               "fp8_gemm": fp8_rows, "attention": attn, "copy_gbytes_per_s": copy_gbps,
               "h2d_gbytes_per_s": h2d, "d2h_gbytes_per_s": d2h, "collectives": coll, "host_block_s": host_block,
               "host_block_fp8_s": host_block_fp8,
               "sustained": sustained, "notes": notes}
    _print_device_summary(console, base_profile, profile, summary)
    if not on_gpu:
        console.print(cpu_warning(), style="bold red", markup=False, highlight=False, soft_wrap=True)
    return path, profile, summary


def calibrate_host(out: str | None = None, base: str | None = None, device: str = "auto", console=None,
                   steps: int = 12, modes=HOST_MODES, moe: bool = True):
    """Measure only this machine's host dispatch per block (measure_host_block: HOST_REPEATS pairs of short runs
    per mode; one pair per mode took 36-46 s on the H100 hosts of 2026-11-23, most of it start-up and compiles,
    which the repeats share) into a copy of `base`, everything else kept.  A launch-bound
    plan's step is its host's dispatch time, and that moved 1.9x per block between two machines of one
    kind (benchmarks/results/2026-11-23-h100: the launches' own dispatch phases); the GPU's terms (the
    curves, bandwidths, a `--from-run` refit's fractions) carry from machine to machine, the host's do not.
    So: a profile calibrated or refit anywhere, then `--host-only --base THAT` on the machine that launches.
    Returns (path, profile, measured host_block_s)."""
    t_start = time.perf_counter()
    torch, dev, on_gpu, device_name = _open_device(device)
    console = console or _console()
    if not on_gpu:
        console.print(cpu_warning("the host dispatch of parplan's CPU runtime, not of a GPU host's"),
                      style="bold red", markup=False, highlight=False, soft_wrap=True)
    if base is None:
        base = base_for_device(device_name)[0] if on_gpu else DEFAULT_BASE
    base_profile = _load_base(base)
    host_name = _calibrated_name(base_profile.name, "-host")
    path = check_out_path(out, host_name, base_file(base), "-remeasured", console)

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    fp8_on = fp8_measurable(torch, dev, base_profile)
    n = (len(modes) + (len(HOST_FP8_MODES) if fp8_on else 0)
         + ((len(MOE_PROBE_EXPERTS) + 1) * len(HOST_MOE_MODES) if moe else 0)) * len(HOST_BLOCKS) * HOST_REPEATS
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as prog:
        task = prog.add_task(f"host dispatch per block (parplan's runtime, {n} short runs)", total=n)
        shares: dict[str, float] = {}
        spread: dict[str, float] = {}
        host = measure_host_block(dev.type, steps=steps, advance=lambda: prog.advance(task), modes=modes, shares=shares,
                                  spread=spread)
        host_fp8, fp8_note = (measure_fp8_host_block(dev.type, lambda: prog.advance(task), steps) if fp8_on
                              else ({}, None))
        eager_block, eager_note = (measure_eager_host_block(dev.type, lambda: prog.advance(task), steps) if moe
                                   else ({}, None))
        moe_block, moe_expert, moe_note = (measure_moe_host_block(dev.type, lambda: prog.advance(task), steps) if moe
                                           else ({}, {}, None))
    noisy = noisy_host_note(spread)
    elapsed = time.perf_counter() - t_start
    data = base_profile.model_dump(mode="json")
    data["name"] = host_name  # not the base's: this file is not the shipped (or refit) profile
    data["host_block_s"] = {**(data.get("host_block_s") or {}), **{k: float(f"{v:.4g}") for k, v in host.items()}}
    data["host_forward_share"] = _remeasured_shares(data.get("host_forward_share"), host, shares)
    data["host_block_fp8_s"], dropped = _host_field("host_block_fp8_s", "FP8", data.get("host_block_fp8_s"), host_fp8)
    moe_notes = apply_moe_host(data, moe_block, moe_expert, eager_block)
    fp8_what = ("; with FP8 linears: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in host_fp8.items())
                if host_fp8 else "")
    where = f"{cpu_name()} host of {device_name}" if on_gpu else f"{device_name} (CPU runtime: {TEST_ONLY_MARK})"
    what = ", ".join(f"{k} {v * 1e3:.2f} ms" + (f" (forward share {shares[k]:.2f})" if k in shares else "")
                     + (f" (spread {spread[k]:.0%})" if k in spread else "") for k, v in host.items())
    data["sources"] = list(data.get("sources") or []) + [
        f"[calibrate --host-only] {TOOL} --host-only --device {dev.type} --base {base_profile.name} ({_today()}, {where}): "
        f"host dispatch per block fwd+bwd (runtime{', compiled' if on_gpu else ''}, probe of hidden 256 x 128 tokens, "
        f"{HOST_BLOCKS[1]} minus {HOST_BLOCKS[0]} blocks, median of {HOST_REPEATS} pairs): {what}{fp8_what}"
        f"{moe_host_text(moe_block, moe_expert, eager_block)}; every other field from {base_profile.name}"] + [
        f"[calibrate --host-only] {x}" for x in (noisy, fp8_note, dropped, eager_note, moe_note, *moe_notes) if x]
    data["measured"] = ((data.get("measured") or "").rstrip("; ") + "; " if data.get("measured") else "") + \
        f"{_today()}: host_block_s re-measured on {where} ({elapsed:.0f} s)"
    from .schema import HardwareProfile
    profile = HardwareProfile(**data)
    write_profile(profile, path)
    from rich.table import Table
    t = Table(title=f"host dispatch per block on {where}", title_justify="left")
    for c in ("recompute", f"{base_profile.name} ms", "measured ms", f"spread over {HOST_REPEATS}"):
        t.add_column(c, justify="left" if c == "recompute" else "right")
    for k, v in host.items():
        old = base_profile.host_block_s.get(k)
        t.add_row(k, f"{old * 1e3:.2f}" if old is not None else "-", f"{v * 1e3:.2f}",
                  f"{spread[k]:.0%}" if k in spread else "-")
    console.print(t)
    if noisy:
        console.print(f"note: {noisy}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"host calibration took {elapsed:.1f} s", markup=False, highlight=False)
    return path, profile, host


def _ms(per_mode: dict, modes=HOST_MOE_MODES, digits: int = 2) -> str:
    """A host field's readings in ms, mode after mode ("-" where none)."""
    return " / ".join(f"{per_mode[k] * 1e3:.{digits}f}" for k in modes if k in per_mode) or "-"


def _print_device_summary(console, base, prof, s) -> None:
    from rich.table import Table

    t = Table(title=f"calibrated {prof.name} on {s['device']}", title_justify="left")
    for c in ("field", base.name, "calibrated"):
        t.add_column(c, justify="left" if c == "field" else "right")
    for r in summary_rows(base, prof, s):
        t.add_row(*r)
    console.print(t)
    for n in s["notes"]:
        console.print(f"note: {n}", markup=False, highlight=False)
    if s.get("sustained"):
        console.print(sustained_note(s["sustained"]), markup=False, highlight=False, soft_wrap=True)
    console.print(f"calibration took {s['elapsed_s']:.1f} s" +
                  (f" ({PhaseClock.render(s['phases_s'])})" if s.get("phases_s") else ""),
                  markup=False, highlight=False, soft_wrap=True)


def summary_rows(base, prof, s) -> list[tuple[str, str, str]]:
    """calibrate's table: (field, the base profile's value, the calibrated one's) a row."""
    fmt_curve = lambda c: " ".join(f"{x:.3g}:{y:.2f}" for x, y in c)  # noqa: E731
    rows = [
        ("peak bf16 TFLOP/s", f"{base.peak_dense_tflops.get('bf16', 0):g}", f"{prof.peak_dense_tflops.get('bf16', 0):.4g}"),
        ("matmul curve GFLOP:eff", fmt_curve(base.matmul_efficiency_curve), fmt_curve(prof.matmul_efficiency_curve)),
        ("attention curve seq:eff", fmt_curve(base.attention_efficiency_curve), fmt_curve(prof.attention_efficiency_curve)),
        ("hbm GB/s x efficiency", f"{base.hbm_gbytes_per_s:g} x {base.hbm_efficiency:.3f}",
         f"{prof.hbm_gbytes_per_s:g} x {prof.hbm_efficiency:.3f}"),
        ("host link GB/s", f"{base.host_link_gbytes_per_s:g}", f"{prof.host_link_gbytes_per_s:g}"),
        ("host ms per block (none/sel/full/op)", _ms(base.host_block_s, HOST_MODES), _ms(prof.host_block_s, HOST_MODES)),
        ("uncompiled (none/full)", _ms(base.host_block_eager_s), _ms(prof.host_block_eager_s)),
        ("MoE block + an expert (none/full)", _ms(base.host_moe_block_s) + " + " + _ms(base.host_moe_expert_s, digits=3),
         _ms(prof.host_moe_block_s) + " + " + _ms(prof.host_moe_expert_s, digits=3)),
        ("nvlink efficiency / latency", f"{base.nvlink.efficiency:g} / {base.nvlink.latency_s:.2g} s",
         f"{prof.nvlink.efficiency:g} / {prof.nvlink.latency_s:.2g} s"),
        ("optimizer bandwidth fraction / us a tensor",
         f"{base.optimizer_bandwidth_fraction:g} / {base.optimizer_host_per_tensor_s * 1e6:.3g}",
         f"{prof.optimizer_bandwidth_fraction:g} / {prof.optimizer_host_per_tensor_s * 1e6:.3g}"),
        ("sustained matmul fraction", f"{base.sustained_matmul_fraction:g}", f"{prof.sustained_matmul_fraction:g}"
         + (" (measured)" if s.get("sustained") else " (kept)")),
    ]
    return rows


# ----------------------------------------------------------------------------------------------
# Refit from run reports
# ----------------------------------------------------------------------------------------------

def read_report(path: str) -> dict:
    """A launch report (parallel_layers/train.py build_report) reduced to what the refit needs."""
    from pydantic import ValidationError

    from .schema import Plan, json_type_name

    p = Path(path)
    fix = "give the report.json `parplan launch` wrote (runs/<time>/report.json)"
    if path == "-":
        raise CalibrationError(f"--from-run reads report files, not stdin (-); {fix}")
    if p.is_dir():
        raise CalibrationError(f"run report {path} is a folder; give the report.json in it")
    if not p.is_file():
        raise CalibrationError(f"run report {path} {'is not a regular file' if p.exists() else 'does not exist'}; {fix}")
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise CalibrationError(f"run report {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except UnicodeDecodeError as e:
        raise CalibrationError(f"run report {path} is not UTF-8 text (byte {e.start}: {e.reason}); give the "
                               "report.json `parplan launch` wrote") from None
    except RecursionError:
        raise CalibrationError(f"run report {path} is not a report: its JSON is nested too deeply") from None
    except OSError as e:
        raise CalibrationError(f"cannot read run report {path}: {e.strerror or e}") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise CalibrationError(f"run report {path} is not a report: a number in it has more digits than can be read; "
                               f"{fix}") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"run report {path} must be a JSON object, got {json_type_name(data)}")
    if "plan" not in data and "model" in data and "parallel" in data:  # plan.json, beside the report
        raise CalibrationError(f"run report {path} is a plan, not a launch report; {fix}")
    if not isinstance(data.get("plan"), dict):
        raise CalibrationError(f"run report {path} has no plan (write it with `parplan launch --report`)")
    try:
        plan = Plan.model_validate(data["plan"])
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "plan"
        from .schema import error_message
        raise CalibrationError(f"run report {path}: invalid plan: {loc}: {error_message(err)}") from None
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise CalibrationError(f"run report {path} has no steps to measure")
    times = []
    for s in steps:
        t = s.get("step_time_s") if isinstance(s, dict) else None
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
            raise CalibrationError(f"run report {path}: every step needs a positive step_time_s, got {t!r}")
        times.append(float(t))
    device = str(data.get("device") or "")
    if device in ("cpu", "mps", ""):
        raise CalibrationError(f"run report {path} ran on {device or 'an unknown device'}: not a measurement of "
                               f"{plan.hardware.name} GPUs; refit from cuda runs")
    warmup = data.get("warmup_steps")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        warmup = min(2, len(times) // 2)  # launch's own rule (parallel_layers/train.py build_report)
    # the first step compiles and warms up (3-15 s on a GPU against a fraction of a second after): launch counts it
    # as warm-up whenever a second step follows (warmup_steps = min(2, steps // 2)), so its warmup_steps is 0 only
    # when `--steps 1` ran that step alone, which the fit had taken for the step time (sustained 0.83 -> 0.02).
    # The timed steps are those after the warm-up, never the first; none left is no measurement
    start = max(warmup, 1)
    if len(times) <= start:
        what = ("has one step, the first, which compiles and warms up" if len(times) == 1 else
                f"has {len(times)} steps, all of them warm-up (warmup_steps {warmup})")
        raise CalibrationError(f"run report {path} {what}: no timed step to fit -- fix: launch with more steps "
                               f"(e.g. parplan launch --steps 10: the first 2 are warm-up)")
    # an fp16 step skipped for overflowed gradients (the report's "skipped") ran no optimizer step: not a step's time
    timed = [i for i in range(start, len(steps)) if not steps[i].get("skipped")] or list(range(start, len(steps)))
    measured = [times[i] for i in timed]
    reserved = []
    peaks = data.get("peak_memory_bytes")
    if isinstance(peaks, dict):
        for m in peaks.values():
            v = m.get("reserved") if isinstance(m, dict) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                reserved.append(float(v))
    def phase(key):
        """A step phase's median over the measured steps, where every one of them has it (else None)."""
        vals = [steps[i].get(key) for i in timed]
        ok = vals and all(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0 for a in vals)
        return statistics.median(vals) if ok else None

    return {"path": str(path), "plan": plan, "device": device, "torch_version": data.get("torch_version"),
            "step_time_s": statistics.median(measured), "steps_used": len(measured),
            "reserved_bytes": max(reserved) if reserved else None,
            "after_s": phase("after_s"), "host_forward_s": phase("host_forward_s"),
            "host_dispatch_s": phase("host_dispatch_s")}


def measured_forward_share(run: dict) -> float | None:
    """The forward's share of a launch-bound one-stage run's dispatch, from its report's phases: the first
    micro-batch's forward dispatch (host_forward_s) over one micro-batch's share of the whole dispatch.  It
    counts the embedding, head and loss with the forward and their backward with the rest, unlike the calibrate
    probe's difference of two block counts."""
    plan = run["plan"]
    if plan.parallel.pp != 1 or not run.get("host_forward_s") or not run.get("host_dispatch_s"):
        return None
    share = run["host_forward_s"] * plan.training.num_microbatches / run["host_dispatch_s"]
    return share if 0 < share < 1 else None


def base_from_report(report: str, name: str, console=None) -> str:
    """The profile a report's plan names, for --from-run without --base: a shipped name as is; a relative
    path as launched, which only resolves from the folder the launch ran in, so from here, else beside the
    report or in a folder above it (launch reports sit under runs/ or benchmarks/results/... of the repository
    the launch ran in).  One line naming the report when it is nowhere."""
    from hardware_profiles import find_upward, looks_like_path
    if not looks_like_path(name) or Path(name).exists():
        return name
    found = find_upward(name, Path(report).resolve().parent)
    if found is not None:
        if console is not None:
            console.print(f"base: {found} (the hardware of {report}'s plan, {name}, found above the report)",
                          markup=False, highlight=False, soft_wrap=True)
        return str(found)
    raise CalibrationError(f"run report {report}: its plan's hardware profile {name} is not found from here, beside the "
                           f"report or in a folder above it -- fix: pass --base NAME|PATH (the profile the runs were "
                           f"planned with)")


def check_devices(runs: list[dict], base_profile, console=None) -> None:
    """Refuse reports from another GPU than the base profile describes, where both are known GPU families
    (launch.gpu_family): a refit of one GPU's profile from another GPU's step times is neither.  Where either is
    not (a device such as "NVIDIA GeForce RTX 4090" or "cuda", or a base whose name and description name no GPU),
    nothing can be compared: a note on `console` says so, once per device, and the refit goes on."""
    from .launch import gpu_family, profile_family

    want = profile_family(base_profile)
    unmatched: dict[str, list[str]] = {}
    for r in runs:
        have = gpu_family(r["device"])
        if want and have and want != have:
            name, matched = base_for_device(r["device"])
            raise CalibrationError(f"run report {r['path']} ran on {r['device']} ({have}), and the base profile "
                                   f"{base_profile.name} describes {want} GPUs -- fix: pass the --base of the GPU the "
                                   f"runs used" + (f" (e.g. --base {name}, or its calibrated profile)" if matched else ""))
        if not (want and have):
            unmatched.setdefault(r["device"], []).append(r["path"])
    if console is None:
        return
    for device, paths in unmatched.items():
        which = paths[0] if len(paths) == 1 else f"{len(paths)} reports ({paths[0]}, ...)"
        if not gpu_family(device):
            why = f"'{device}' is no GPU this tool recognises"
        else:
            why = f"the base profile {base_profile.name} names no GPU this tool recognises"
        target = f"{base_profile.name}'s {want}" if want else f"{base_profile.name}'s"
        console.print(f"note: {which} ran on {device}, which could not be matched to {target} GPU ({why}); "
                      f"refitting it anyway -- refit only from runs on the GPU the base profile describes",
                      markup=False, highlight=False, soft_wrap=True)


def report_labels(paths: list[str]) -> tuple[list[str], str]:
    """Short labels that tell the reports apart (all are usually named report.json): each path relative
    to the reports' common folder (with one report, relative to its folder's parent); and that folder,
    relative to the current directory where it is under it."""
    res = [Path(p).resolve() for p in paths]
    common = Path(os.path.commonpath([str(r.parent) for r in res]))
    if len(set(res)) == 1:
        common = common.parent
    labels = [os.path.relpath(r, common) for r in res]
    try:
        under = str(common.relative_to(Path.cwd().resolve()))
    except ValueError:
        under = str(common)
    return labels, under


def _predict(plan, profile):
    """The plan's prediction (planner.core.evaluate_plan) under a candidate profile, validated as a profile
    file would be (a fit that strays outside a field's range is refused the same way), without writing it."""
    from pydantic import ValidationError

    from hardware_profiles import _one_line

    from .core import PlannerError, evaluate_plan
    from .schema import HardwareProfile

    try:
        checked = HardwareProfile.model_validate(profile.model_dump())
    except ValidationError as e:
        raise CalibrationError(_one_line(f"candidate {profile.name}", e, HardwareProfile)) from None
    try:
        return evaluate_plan(plan, profile=checked).prediction
    except PlannerError as e:
        raise CalibrationError(str(e)) from None


def increasing_root(f, lo: float, hi: float, rel_tol: float, f_tol: float = 0.0, max_evals: int = 100) -> float:
    """x in [lo, hi] where the increasing function f crosses zero, given f(lo) < 0 < f(hi).  Regula
    falsi with the Illinois modification (Dowell & Jarratt 1971): the step times it is used for are
    near-linear in the fitted parameter, so the secant lands close at once, and halving the retained
    end's value keeps the bracket shrinking from both sides where the function bends.  Returns a point
    where |f| <= f_tol, or the bracket's middle once it is within `rel_tol` of its ends."""
    f_lo, f_hi = f(lo), f(hi)
    side = 0
    for _ in range(max_evals):
        if hi - lo <= rel_tol * max(abs(lo), abs(hi)):
            break
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        if not lo < x < hi:  # rounding at the ends: bisect instead
            x = (lo + hi) / 2
        fx = f(x)
        if abs(fx) <= f_tol:
            return x
        if fx < 0:
            lo, f_lo = x, fx
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = x, fx
            if side == 1:
                f_lo /= 2
            side = 1
    return (lo + hi) / 2


def fit_sustained(plan, profile, measured_s: float, predict) -> tuple[float, bool]:
    """sustained_matmul_fraction in (0, 1] at which the predicted step time equals `measured_s`.
    Step time falls monotonically as the fraction grows (only matmul/attention time scales with it),
    and grows about linearly in its inverse, so the root is found in x = 1 / fraction; (1.0, True)
    when even 1.0 predicts slower than measured."""
    def t(s):
        return predict(plan, profile.model_copy(update={"sustained_matmul_fraction": s})).step_time_s
    t1 = t(1.0)
    if t1 >= measured_s:
        return 1.0, True
    lo = 1e-4
    if t(lo) <= measured_s:
        return lo, True
    x = increasing_root(lambda x: t(1.0 / x) - measured_s, 1.0, 1.0 / lo, 1e-7, f_tol=1e-10 * measured_s)
    return 1.0 / x, False


def launch_bound(prediction) -> bool:
    return any(w.startswith("launch-bound") for w in prediction.warnings)


def fit_host_block(plan, profile, measured_s: float, predict) -> float | None:
    """host_block_s[plan's recompute mode] at which the predicted step equals `measured_s` (the step
    grows with it once blocks are launch-bound); None when even no host time predicts slower."""
    mode = plan.parallel.recompute

    def t(h):
        return predict(plan, profile.model_copy(update={"host_block_s": {**profile.host_block_s, mode: h}})).step_time_s
    if t(0.0) >= measured_s:
        return None
    lo, hi = 0.0, max(profile.host_block_s.get(mode, 0.0), 1e-3)
    while t(hi) < measured_s:
        lo, hi = hi, hi * 2
        if hi > 10.0:
            return None
    return increasing_root(lambda h: t(h) - measured_s, lo, hi, 1e-9, f_tol=1e-10 * measured_s)


def fit_optimizer(runs: list[dict], profile, predict) -> tuple[float, float, int] | None:
    """optimizer_bandwidth_fraction f and optimizer_host_per_tensor_s h from the reports' after-backward
    phase (`after_s`: gradient reduction + optimizer step, device-synchronised), on the runs where that
    phase is the optimizer step alone (one rank: no pipeline, no data parallelism, no offload).  The
    model's optimizer term is passes/f + tensors x h; the passes and the tensor count come from the
    cost model itself (two predictions with f and h moved), then least squares for (1/f, h) over the
    runs, with 1/f >= 1 and h >= 0 (if h would be negative, h = 0 and 1/f the median ratio).  None
    with fewer than two such runs.  Returns (f, h, runs used)."""
    rows = []
    for r in runs:
        par = r["plan"].parallel
        if r.get("after_s") is None or par.pp * par.dp * par.tp * par.cp != 1 or par.offload != "none":
            continue
        base = profile.model_copy(update={"optimizer_bandwidth_fraction": 1.0, "optimizer_host_per_tensor_s": 0.0})
        t0 = predict(r["plan"], base).time_breakdown.optimizer_s
        passes = predict(r["plan"], base.model_copy(update={"optimizer_bandwidth_fraction": 0.5})).time_breakdown.optimizer_s - t0
        tensors = (predict(r["plan"], base.model_copy(update={"optimizer_host_per_tensor_s": 1e-3})).time_breakdown.optimizer_s
                   - t0) / 1e-3
        rows.append((passes, round(tensors), r["after_s"]))
    if len(rows) < 2:
        return None
    return (*solve_optimizer(rows), len(rows))


def host_unmeasured_warning(runs: list[dict], base_profile, base: str, fits: list[float]) -> str | None:
    """One line for stderr where the base has no host dispatch (host_block_s) for some reports' recompute mode, else
    None.  Without it the cost model has no host bound: no such report can be told launch-bound, so each feeds
    sustained_matmul_fraction, and a launch-bound one (a small model or micro-batch, whose step is the CPU's
    dispatch) reads as slow GPU compute and pulls the fraction down (the shipped h200-sxm-141gb over the 2026-11-28
    H200 grid: 0.83 -> 0.39, its compute-bound runs then predicted 77-135 % slow).
    A warning, not a refusal: reports of compute-bound runs alone fit the fraction right without a host
    measurement (the shipped profiles but H100's have none, and a large-model session is a usual first refit), and
    refusing would ask for a measurement on the launch host that such a refit does not need; the table's 'after'
    errors show which case it is, and the warning names the fix."""
    host = base_profile.host_block_s

    def measured(mode):  # as the cost model reads it (cost_models.hardware): selective-op takes full's if absent
        return host.get(mode) or (mode == "selective-op" and host.get("full"))
    blind = [(r["plan"].parallel.recompute, s) for r, s in zip(runs, fits) if not measured(r["plan"].parallel.recompute)]
    if not blind:
        return None
    missing, n = list(dict.fromkeys(m for m, _ in blind)), len(blind)
    fits = [s for _, s in blind]
    if base_profile.host_block_s:
        what = (f"for recompute {', '.join(missing)}, so {n} of the {len(runs)} reports (those planned with it) "
                "cannot be told launch-bound and fit")
    else:
        what = f"(no host_block_s), so no report can be told launch-bound and all {len(runs)} fit"
    spread = f" (per-report fits {min(fits):.3g} to {max(fits):.3g})" if len(fits) > 1 else ""
    return (f"warning: {base_profile.name} has no measured host dispatch {what} sustained_matmul_fraction{spread}: a "
            f"launch-bound run (small model or micro-batch) among them pulls the fraction down -- fix: measure the host "
            f"first with `parplan calibrate --host-only --base {base}` on the launch machine, then refit with --base "
            f"the profile it writes")


_SUPERSEDED = re.compile(r" \(superseded for ([a-z_, ]+) by the --from-run refit below\)$")


def _superseded(line: str, refit: list[str]) -> str:
    """A source line that says fields were "kept from" a base (a calibrate's, or a hand update's), marked where a
    later refit fitted some of them; a line marked by an earlier refit gains the fields this one fits."""
    if "kept from" not in line:
        return line
    mark = _SUPERSEDED.search(line)
    text, before = (line[:mark.start()], mark.group(1).split(", ")) if mark else (line, [])
    named = list(dict.fromkeys(before + [f for f in refit if f in text.split("kept from")[0]]))
    return text + f" (superseded for {', '.join(named)} by the --from-run refit below)" if named else line


def _is_launch_report(path) -> bool:
    """Whether `path` is an existing, non-empty `parplan launch` report (launch.is_launch_report: a BOM, a huge or a
    deeply nested file read as launch reads them)."""
    from .launch import is_launch_report
    path = Path(path)
    try:
        return path.is_file() and path.stat().st_size > 0 and is_launch_report(path)
    except OSError:
        return False


def distinct_reports(reports: list[str]) -> tuple[list[str], list[str]]:
    """The reports in order with repeats dropped (the same file by another path, or a byte-identical copy), and the
    paths dropped.  A file that cannot be read is kept: read_report says why."""
    import hashlib
    seen, kept, repeated = set(), [], []
    for r in reports:
        if not Path(r).is_file():  # a folder, a device (/dev/zero: read for ever), missing: read_report says which
            kept.append(r)
            continue
        try:
            key = hashlib.sha256(Path(r).read_bytes()).hexdigest()
        except OSError:
            kept.append(r)
            continue
        if key in seen:
            repeated.append(r)
        else:
            seen.add(key)
            kept.append(r)
    return kept, repeated


def calibrate_from_runs(reports: list[str], base: str | None = None, out: str | None = None, console=None):
    """Refit a profile from launch reports: first the optimizer step (optimizer_bandwidth_fraction,
    optimizer_host_per_tensor_s) on the one-rank reports that carry the after-backward phase, then
    sustained_matmul_fraction on the reports that are not launch-bound (the base's kept if every one is; a base
    with no host dispatch for a report's recompute mode cannot tell it launch-bound: a warning), then host_forward_share
    per recompute mode from the phases of the launch-bound one-stage reports, then host_block_s per recompute mode
    on the launch-bound ones (the runs measure dispatch under real load; the calibrate probe measures it on a tiny
    model), then memory_reserve_gbytes.
    Returns (path, profile, rows) with one row per report (predictions before/after)."""
    console = console or _console()
    reports, repeated = distinct_reports(reports)
    if repeated:  # a report counted twice would weigh its run twice in every fit
        console.print(f"note: {len(repeated)} report{'s' if len(repeated) > 1 else ''} given more than once, counted "
                      f"once: {', '.join(repeated)}", markup=False, highlight=False, soft_wrap=True)
    runs = [read_report(r) for r in reports]
    from .launch import gpu_family
    kinds = collections.Counter(gpu_family(r["device"]) or r["device"] for r in runs)
    if len(kinds) > 1:  # one profile describes one GPU: before a base is chosen for some of them
        raise CalibrationError(f"the reports ran on {len(kinds)} kinds of device ("
                               + ", ".join(f"{k}: {n} report{'s' if n > 1 else ''}" for k, n in kinds.items())
                               + ") and a profile describes one GPU -- fix: refit each kind's reports apart")
    if base is None:
        names = list(dict.fromkeys(r["plan"].hardware.name for r in runs))
        if len(names) > 1:  # every report is refit against one base: say which
            console.print(f"note: the reports were planned on {len(names)} profiles ({', '.join(names)}); refitting "
                          f"{names[0]}, the first report's (pass --base to choose)", markup=False, highlight=False,
                          soft_wrap=True)
        base = base_from_report(runs[0]["path"], runs[0]["plan"].hardware.name, console)
        base_profile = _load_base(base, f"run report {runs[0]['path']}: its plan's hardware",
                                  " -- fix: pass --base NAME|PATH (the profile the runs were planned with)")
    else:
        base_profile = _load_base(base)
    check_devices(runs, base_profile, console)
    for r in [*reports, *repeated]:  # as --base: the profile must not replace a report it was fitted from
        if out and _same_file(Path(out), Path(r)):
            raise CalibrationError(f"--out {out} is the run report {r}, which it would overwrite -- fix: give another "
                                   f"--out (or none: the default is a new file)")
    path = check_out_path(out, _calibrated_name(base_profile.name), base_file(base), "-refit", console)
    labels, under = report_labels([r["path"] for r in runs])
    from .schema import HardwareProfile

    before = [_predict(r["plan"], base_profile) for r in runs]
    # the optimizer step first (its own measured phase), then everything else against the step time
    opt_fit = fit_optimizer(runs, base_profile, _predict)
    if opt_fit:
        base_fit = base_profile.model_copy(update={"optimizer_bandwidth_fraction": opt_fit[0],
                                                   "optimizer_host_per_tensor_s": opt_fit[1]})
    else:
        base_fit = base_profile
    fits = [fit_sustained(r["plan"], base_fit, r["step_time_s"], _predict) for r in runs]
    bound = [launch_bound(b) for b in before]
    # median of the per-report fits over the compute-bound runs (the fraction barely moves a
    # launch-bound one): robust to the odd noisy run
    # every report launch-bound: their steps are the host's dispatch, which a fitted fraction would take for slow
    # GPU compute (one such report had set 0.83 -> 0.21, and a 70B plan 3.6x too slow).  Where the base has a
    # measured dispatch the fraction is kept and the runs refit host_block_s; without one, fitted as before, and
    # said by host_unmeasured_warning below
    kept = all(bound) and bool(base_profile.host_block_s)
    host_warning = host_unmeasured_warning(runs, base_profile, base, [s for s, _ in fits])
    if kept:
        s_new = base_profile.sustained_matmul_fraction
        console.print(f"note: every report is launch-bound (the host's dispatch sets its step), so "
                      f"sustained_matmul_fraction stays {s_new:g} (the base's) and the runs refit host_block_s; give "
                      "compute-bound reports (a larger model or micro-batch) to fit the fraction",
                      markup=False, highlight=False, soft_wrap=True)
    else:
        s_new = statistics.median(s for (s, _), lb in zip(fits, bound) if not lb or all(bound))
        s_new = min(1.0, max(1e-4, s_new))
    # the forward's share of the dispatch, measured (not fitted) in launch-bound one-stage runs' phases: before
    # the host fit, which solves each launch-bound run's step for its dispatch under these shares
    share_fits: dict[str, list[float]] = {}
    for r, lb in zip(runs, bound):
        sh = measured_forward_share(r) if lb else None
        if sh is not None:
            share_fits.setdefault(r["plan"].parallel.recompute, []).append(sh)
    share_new = {**base_profile.host_forward_share, **{k: statistics.median(v) for k, v in share_fits.items()}}
    candidate = base_fit.model_copy(update={"sustained_matmul_fraction": s_new, "host_forward_share": share_new})
    host_fits: dict[str, list[float]] = {}
    for r, lb in zip(runs, bound):
        if lb and base_profile.host_block_s:
            h = fit_host_block(r["plan"], candidate, r["step_time_s"], _predict)
            if h is not None:
                host_fits.setdefault(r["plan"].parallel.recompute, []).append(h)
    host_new = {**base_profile.host_block_s, **{k: statistics.median(v) for k, v in host_fits.items()}}
    candidate = candidate.model_copy(update={"host_block_s": host_new})
    mid = [_predict(r["plan"], candidate) for r in runs]
    gaps = [r["reserved_bytes"] - p.memory_bytes_per_gpu.total for r, p in zip(runs, mid) if r["reserved_bytes"]]
    old_reserve = base_profile.memory_reserve_gbytes
    # the reserve is the base's own (CUDA context, communicator buffers) plus the launches' allocator slack; a base
    # refit before keeps its slack apart, so refitting it again replaces that slack instead of adding it twice
    own_reserve = old_reserve - (base_profile.memory_slack_gbytes or 0.0)
    if base_profile.memory_slack_gbytes is None and "--from-run" in (base_profile.measured or "") and gaps:
        console.print(f"note: {base_profile.name} was refit before 2026-11-29, whose reserve ({old_reserve:g} GB) holds "
                      "a fitted slack it did not record: this fit adds its own to it; refit from a calibrated or "
                      "datasheet profile instead", markup=False, highlight=False, soft_wrap=True)
    slack = statistics.median(gaps) / GB if gaps else base_profile.memory_slack_gbytes
    new_reserve = max(0.0, own_reserve + slack) if slack is not None else old_reserve
    data = candidate.model_dump(mode="json")
    data["sustained_matmul_fraction"] = float(f"{s_new:.6g}")
    data["memory_reserve_gbytes"] = round(new_reserve, 4)
    data["memory_slack_gbytes"] = None if slack is None else round(new_reserve - own_reserve, 4)
    data["host_block_s"] = {k: float(f"{v:.4g}") for k, v in host_new.items()}
    data["host_forward_share"] = {k: float(f"{v:.3g}") for k, v in share_new.items()}
    if opt_fit:
        data["optimizer_bandwidth_fraction"] = float(f"{opt_fit[0]:.4g}")
        data["optimizer_host_per_tensor_s"] = float(f"{opt_fit[1]:.4g}")
    data["name"] = _calibrated_name(base_profile.name)
    devices = sorted({r["device"] for r in runs})
    torches = sorted({str(r["torch_version"]) for r in runs if r["torch_version"]})
    names = " ".join(labels) + (f" (in {under})" if under not in ("", ".") else "")
    what = (f"{_today()}: {TOOL} --from-run ({len(runs)} report{'s' if len(runs) > 1 else ''} on "
            f"{', '.join(devices)}; torch {', '.join(torches) or 'unknown'}): "
            + ("" if kept else "sustained_matmul_fraction, ")
            + ("host_block_s, " if host_fits else "") + ("host_forward_share, " if share_fits else "")
            + ("optimizer_bandwidth_fraction, optimizer_host_per_tensor_s, " if opt_fit else "") + "memory_reserve_gbytes")
    data["measured"] = f"{what}; before: {base_profile.measured}" if base_profile.measured else what
    clamped = sum(c for _, c in fits)
    # an earlier calibrate's line that kept a field from its base, which this refit now fits, is marked as such
    # (it had stood beside the refit's own line, saying the opposite)
    refit = (["sustained_matmul_fraction"] if not kept else []) + (["host_block_s"] if host_fits else []) \
        + (["host_forward_share"] if share_fits else []) + (["optimizer_bandwidth_fraction"] if opt_fit else []) \
        + (["memory_reserve_gbytes"] if gaps else [])
    data["sources"] = [_superseded(line, refit) for line in data.get("sources") or []]
    data["sources"] = list(data.get("sources") or []) + [
        f"[calibrate] {TOOL} --from-run {names} --base {base_profile.name}: sustained_matmul_fraction "
        f"{base_profile.sustained_matmul_fraction:g} -> {s_new:.4g} (median of per-report fits "
        f"{', '.join(f'{s:.4g}' + (' [launch-bound, not used]' if lb and (kept or not all(bound)) else '') for (s, _), lb in zip(fits, bound))}"
        f"{f'; {clamped} clamped' if clamped else ''}); "
        + "".join(f"host_block_s.{k} {base_profile.host_block_s.get(k, 0.0) * 1e3:.3g} -> {host_new[k] * 1e3:.3g} ms "
                  f"(median of {len(v)} launch-bound report(s)); " for k, v in host_fits.items())
        + "".join(f"host_forward_share.{k} {base_profile.host_forward_share.get(k, 0.0):.3g} -> {share_new[k]:.3g} "
                  f"(median over the phases of {len(v)} launch-bound one-stage report(s)); "
                  for k, v in share_fits.items())
        + (f"optimizer_bandwidth_fraction {base_profile.optimizer_bandwidth_fraction:g} -> {opt_fit[0]:.4g} and "
           f"optimizer_host_per_tensor_s {base_profile.optimizer_host_per_tensor_s * 1e6:.3g} -> {opt_fit[1] * 1e6:.3g} us "
           f"(least squares over the after-backward phase of {opt_fit[2]} one-rank report(s)); " if opt_fit else "")
        + "memory_reserve_gbytes "
        f"{old_reserve:g} -> {new_reserve:.4g} (" + (f"{own_reserve:g} of the base's own + the median reserved-peak minus "
                                                      f"predicted total {statistics.median(gaps) / GB:+.3f} GB over "
                                                      f"{len(gaps)} report(s))" if gaps else "no report had reserved memory: kept)")]
    profile = HardwareProfile(**data)
    after = [_predict(r["plan"], profile) for r in runs]
    write_profile(profile, path)
    # the memory columns: the torch reserved peak each profile predicts, its predicted total plus the fitted part of
    # its reserve (memory_slack_gbytes, the launches' reserved-minus-predicted gap; none fitted = 0).  The rest of the
    # reserve (CUDA context, communicator buffers) lies outside torch's reserved peak, so it is left out.  A refit of
    # a refit on the same reports reads the same before and after (the base's slack had been left out of 'before')
    slack_before = base_profile.memory_slack_gbytes or 0.0
    slack_after = profile.memory_slack_gbytes or 0.0
    rows = []
    for r, label, lb, b, a, (s_fit, c) in zip(runs, labels, bound, before, after, fits):
        rows.append({"report": r["path"], "label": label, "launch_bound": lb,
                     "used_for_sustained": not lb or (all(bound) and not kept),
                     "device": r["device"], "measured_step_time_s": r["step_time_s"],
                     "predicted_step_time_s_before": b.step_time_s, "predicted_step_time_s_after": a.step_time_s,
                     "fitted_sustained": s_fit, "clamped": c, "measured_reserved_bytes": r["reserved_bytes"],
                     "predicted_memory_bytes_before": b.memory_bytes_per_gpu.total + slack_before * GB,
                     "predicted_memory_bytes_after": a.memory_bytes_per_gpu.total + slack_after * GB})
    _print_run_table(console, base_profile, profile, rows, under)
    if host_fits:
        console.print("host dispatch per block: " + ", ".join(
            f"{k} {base_profile.host_block_s.get(k, 0.0) * 1e3:.3g} -> {host_new[k] * 1e3:.3g} ms ({len(v)} launch-bound run(s))"
            for k, v in host_fits.items()), markup=False, highlight=False)
    if share_fits:
        console.print("the forward's share of the dispatch: " + ", ".join(
            f"{k} {base_profile.host_forward_share.get(k, 0.0):.3g} -> {share_new[k]:.3g} ({len(v)} launch-bound run(s))"
            for k, v in share_fits.items()), markup=False, highlight=False)
    if opt_fit:
        console.print(f"optimizer step: bandwidth fraction {opt_fit[0]:.3g}, host {opt_fit[1] * 1e6:.3g} us per parameter "
                      f"tensor (least squares over the after-backward phase of {opt_fit[2]} one-rank run(s))",
                      markup=False, highlight=False)
    if host_warning:  # last, below the table, where it is read with the errors it explains
        console.print(host_warning, markup=False, highlight=False, soft_wrap=True)
    return path, profile, rows


def _print_run_table(console, base, prof, rows, under: str = "") -> None:
    from rich.markup import escape
    from rich.table import Table

    def pct(pred, meas):
        return f"{pred / meas - 1:+.1%}" if meas else "-"

    console.print(f"refit {base.name} -> {prof.name}", markup=False, highlight=False, soft_wrap=True)
    step = Table(title=f"step time s, sustained_matmul_fraction {base.sustained_matmul_fraction:g} -> "
                       f"{prof.sustained_matmul_fraction:.4g}", title_justify="left")
    mem = Table(title=f"reserved memory GB, memory_reserve_gbytes {base.memory_reserve_gbytes:g} -> "
                      f"{prof.memory_reserve_gbytes:.4g}", title_justify="left")
    for t, cols in ((step, ("report", "measured", "before", "err", "after", "err", "fit sustained")),
                    (mem, ("report", "measured", "before", "err", "after", "err"))):
        for c in cols:
            t.add_column(c, justify="left" if c == "report" else "right", no_wrap=c in ("report", "fit sustained"))
    for r in rows:
        m = r["measured_step_time_s"]
        mm = r["measured_reserved_bytes"]
        label = escape(str(r.get("label") or r["report"]))
        step.add_row(label, f"{m:.4g}", f"{r['predicted_step_time_s_before']:.4g}",
                     pct(r["predicted_step_time_s_before"], m), f"{r['predicted_step_time_s_after']:.4g}",
                     pct(r["predicted_step_time_s_after"], m),
                     f"{r['fitted_sustained']:.4g}" + (" (clamped)" if r["clamped"] else "")
                     + ("" if r.get("used_for_sustained", True) else " (not used)"))  # why: the line below the tables
        mem.add_row(label, f"{mm / GB:.2f}" if mm else "-", f"{r['predicted_memory_bytes_before'] / GB:.2f}",
                    pct(r["predicted_memory_bytes_before"], mm), f"{r['predicted_memory_bytes_after'] / GB:.2f}",
                    pct(r["predicted_memory_bytes_after"], mm))
    width = console.width
    for t in (step, mem):
        if not console.is_terminal:  # a log or a pipe: the whole table, never cells cut to "..."
            from rich.measure import Measurement
            console.width = max(width, Measurement.get(console, console.options.update_width(10_000), t).maximum)
        console.print(t)
        console.width = width
    if under not in ("", "."):
        console.print(f"reports: paths under {under}", markup=False, highlight=False, soft_wrap=True)
    unused = [r.get("label") or r["report"] for r in rows if not r.get("used_for_sustained", True)]
    if unused:
        console.print(f"launch-bound, not used for sustained_matmul_fraction (they refit host_block_s): {', '.join(unused)}",
                      markup=False, highlight=False, soft_wrap=True)
    console.print("memory: measured = largest torch reserved peak over ranks; before/after = the reserved peak "
                  "each profile predicts: predicted total + its memory_slack_gbytes (the fitted part of "
                  "memory_reserve_gbytes, the launches' reserved-minus-predicted gap; none fitted = 0)",
                  markup=False, highlight=False, soft_wrap=True)
