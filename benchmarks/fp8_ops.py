"""Why parplan's FP8 linears ran 4.6-5.4x slower than predicted on an H100: each FP8 operation alone, GPU and host time.

At the grid's 3B launch shapes.

On 2026-12-06 (`benchmarks/results/2026-12-06-h100`) llama-3b-mbs4-none-fp8 stepped in 1,332 ms against 303 ms for its
16-bit twin (predicted 289 ms), at 263 W against 683 W, the GPU still 0.32 s behind the host when the host had
queued the step: the GPU itself runs something slowly, and the FP8 GEMMs alone do not (that call's
fp8_gemm_shapes.py: 128 GEMM shapes within 3.9 % median of the cost model's FP8 rule).  What is left is the casts
(parallel_layers.fp8.cast: one torch.compile'd function, dynamic=True, for every operand) and the GEMMs in the
layouts and dtypes the backward uses (E5M2 output gradients, an fp32 weight gradient).  This times each alone:

    python3 benchmarks/fp8_ops.py --device cuda --out R/fp8_ops.md --json R/fp8_ops.json

GPU time by CUDA events, host time by the clock around the enqueue, median of --repeats after warm-ups; each
row is written as it finishes (a call stopped at its limit keeps what it measured).  `--device cpu` runs tiny
shapes to check the script (tests/test_fp8_runtime.py); its numbers are the CPU's, no GPU's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from parallel_layers import fp8  # noqa: E402

# benchmarks/gpu_grid.py's llama-3b at micro-batch 4: tokens 4 x 2048, hidden 3072, q/k/v 3072 + 2 x 1024, ffn 8192
GPU_SHAPES = {"tokens": 8192, "hidden": 3072, "qkv": 5120, "ffn": 8192}
CPU_SHAPES = {"tokens": 64, "hidden": 32, "qkv": 48, "ffn": 64}


def _timer(device: str):
    if device == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a.record()
            fn()
            b.record()
            host = time.perf_counter() - t0
            torch.cuda.synchronize()
            return a.elapsed_time(b) / 1e3, host
    else:
        def run(fn):
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
            return t, t
    return run


def operations(device: str, shapes: dict):
    """(name, what it reads, fn) for each operation, in the order they run: eager first, compiled last."""
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16

    def rnd(*s):
        return torch.randn(*s, device=device, dtype=dt, generator=g)
    T, H, Q, F = shapes["tokens"], shapes["hidden"], shapes["qkv"], shapes["ffn"]
    x, w_qkv, w_up = rnd(T, H), rnd(Q, H), rnd(F, H)
    g_up = rnd(T, F)
    x8, sx = fp8._cast_eager(x, fp8.E4M3)
    w8, sw = fp8._cast_eager(w_up, fp8.E4M3)
    g8, sg = fp8._cast_eager(g_up, fp8.E5M2)
    x_col = fp8._col_major(x8)
    g8_t = g8.t().contiguous()
    inf = float("inf")
    amax_compiled = torch.compile(lambda t: t.abs().amax().float(), dynamic=True)
    cast_static = torch.compile(fp8._cast_eager, dynamic=False)
    fmax = torch.finfo(fp8.E4M3).max
    scale_cast = torch.compile(lambda t, s: (t.float() * s).clamp(-fmax, fmax).to(fp8.E4M3), dynamic=True)

    def hybrid(t):  # the amax by ATen's reduction, the scaling and cast one compiled pointwise pass
        s = fmax / torch.clamp(torch.linalg.vector_norm(t, inf).float(), min=1e-12)
        return scale_cast(t, s), s.reciprocal()
    ops = []
    for name, t in (("x (tokens, hidden)", x), ("w_up (ffn, hidden)", w_up), ("dY_up (tokens, ffn)", g_up),
                    ("w_qkv (qkv, hidden)", w_qkv)):
        ops += [(f"amax eager abs().amax(): {name}", t, lambda t=t: t.abs().amax()),
                (f"amax eager vector_norm(inf): {name}", t, lambda t=t: torch.linalg.vector_norm(t, inf)),
                (f"cast eager (_cast_eager): {name}", t, lambda t=t: fp8._cast_eager(t, fp8.E4M3))]
    ops += [("GEMM bf16 forward x w_up^T", None, lambda: torch.matmul(x, w_up.t())),
            ("GEMM fp8 forward x8 w8^T -> bf16", None, lambda: fp8._mm(x8, sx, w8.t(), sw, dt)),
            ("GEMM bf16 dgrad dY w_up", None, lambda: torch.matmul(g_up, w_up)),
            ("GEMM fp8 dgrad dY8(e5m2) w8(col) -> bf16", None, lambda: fp8._mm(g8, sg, fp8._col_major(w8), sw, dt)),
            ("GEMM bf16 wgrad dY^T x -> fp32", None, lambda: torch.matmul(g_up.t(), x).float()),
            ("GEMM fp8 wgrad dY8^T(e5m2) x8(col) -> fp32", None,
             lambda: fp8._mm(g8_t, sg, x_col, sx, torch.float32)),
            ("GEMM fp8 wgrad dY8^T(e5m2) x8(col) -> bf16", None, lambda: fp8._mm(g8_t, sg, x_col, sx, dt)),
            ("fp8 transpose copy dY8^T", None, lambda: g8.t().contiguous()),
            ("fp8 column-major copy x8", None, lambda: fp8._col_major(x8))]
    for name, t in (("x (tokens, hidden)", x), ("w_up (ffn, hidden)", w_up), ("dY_up (tokens, ffn)", g_up),
                    ("w_qkv (qkv, hidden)", w_qkv), ("x view (tokens, hidden) of (4, T/4, hidden)",
                                                     x.view(4, -1, H).reshape(-1, H))):
        ops += [(f"amax compiled dynamic: {name}", t, lambda t=t: amax_compiled(t)),
                (f"cast parplan (fp8.cast): {name}", t, lambda t=t: fp8.cast(t, fp8.E4M3)),
                (f"cast compiled static: {name}", t, lambda t=t: cast_static(t, fp8.E4M3)),
                (f"cast eager amax + compiled pointwise: {name}", t, lambda t=t: hybrid(t))]
    return ops


def measure(device: str, shapes: dict, repeats: int = 10, warmup: int = 3, on_row=None) -> list[dict]:
    run = _timer(device)
    rows = []
    for name, t, fn in operations(device, shapes):
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn()
        times = [run(fn) for _ in range(repeats)]
        gpu = statistics.median(a for a, _ in times)
        host = statistics.median(b for _, b in times)
        row = {"op": name, "gpu_ms": gpu * 1e3, "host_ms": host * 1e3, "took_s": time.perf_counter() - t0}
        if t is not None:  # what one read of the operand moves: its bytes over the GPU time
            row["read_gbytes_per_s"] = t.numel() * t.element_size() / gpu / 1e9 if gpu > 0 else None
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows


def markdown(rows: list[dict], device: str, shapes: dict) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = [f"# parplan's FP8 operations one by one ({name}, torch {torch.__version__})", "",
           f"Generated by `python3 benchmarks/fp8_ops.py --device {device}`: shapes {shapes} (the grid's llama-3b at "
           "micro-batch 4 on a GPU), GPU time by CUDA events and host time around the enqueue, median of the "
           "repeats after warm-ups; read GB/s: the operand's bytes over the GPU time.", "",
           "| operation | GPU ms | host ms | operand read GB/s |", "|---|---:|---:|---:|"]
    for r in rows:
        bw = r.get("read_gbytes_per_s")
        out.append(f"| {r['op']} | {r['gpu_ms']:.3f} | {r['host_ms']:.3f} | {'' if bw is None else f'{bw:.0f}'} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    shapes = GPU_SHAPES if a.device == "cuda" else CPU_SHAPES

    def write(rows):
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1))
        if a.out:
            a.out.write_text(markdown(rows, a.device, shapes))
    rows = measure(a.device, shapes, repeats=a.repeats, on_row=write)
    print(markdown(rows, a.device, shapes))


if __name__ == "__main__":
    main()
