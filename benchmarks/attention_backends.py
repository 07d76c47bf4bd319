"""Which attention kernel does the H100/H200 profile's attention curve stand for, and how far apart are they?

The profiles' attention_efficiency_curve is `parplan calibrate`'s measurement of torch's scaled_dot_product_attention,
causal, forward + backward (planner.calibrate.measure_attention), with the kernel torch picks by itself.
NVIDIA's NeMo / Megatron-Core runs (the held-out nemo_h100_bf16 and nemo_launcher_gpt3 sets, all under-predicted)
run Transformer Engine's cuDNN fused attention, and the FlashAttention-3 paper's H100 figures put cuDNN's
forward well above FlashAttention-2's: was the curve the slower kernel's?  Measured 2026-12-04 on an H200 (torch
2.11, results/2026-12-04-h200/attention_backends.md): no.  The call's own calibrate read 344 / 437 / 514 / 541
TFLOP/s at 1K / 2K / 4K / 16K tokens, the CUDNN_ATTENTION column's 324 / 437 / 507 / 540 (FLASH_ATTENTION's
187 / 238 / 275 / 318): torch 2.11 picks cuDNN's kernel there, and the 2026-11-22 H100 calibrate's 529 at 8K
(torch 2.11 too) reads the same.  torch ships both kernels
behind the same call (torch.nn.attention.SDPBackend.FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION), so one
device call can measure them side by side at the calibrate's own shapes and FLOP convention:

    python3 benchmarks/attention_backends.py --out R/attention_backends.md [--json R/attention_backends.json]

prints, per sequence length, each backend's causal forward + backward TFLOP/s (calibrate's count: the causal
forward's 2 x 2 x b x h x s^2 x d / 2, times 3.5 for forward + backward with its recomputed forward), and the ratio of
each to the flash kernel's: what a `cudnn` attention curve would change (a kernel torch cannot run here reads "-",
with why).  On a machine without CUDA it runs the math backend at small shapes only, to check the script
(`--device cpu`, tests/test_sustained.py); its numbers are no GPU's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")  # MATH: on CPU only


def measure(device: str, quick: bool) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from planner.calibrate import _Timer, attention_cases, measure_attention
    on_gpu = device == "cuda"
    dev = torch.device(device)
    timer = _Timer(torch, dev, warmup=3, reps=10 if on_gpu else 3, sample_s=2e-3 if on_gpu else 1e-2)
    cases = attention_cases(on_gpu, quick)
    dtype = "bf16" if on_gpu else "fp32"
    # the math kernel on the GPU only as a last resort's reference: at 16K it holds the whole score matrix, slowly
    names = [b for b in BACKENDS if b != "MATH" and hasattr(SDPBackend, b)] if on_gpu else ["MATH"]
    rows: dict[str, list] = {}
    for name in names:
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                rows[name] = measure_attention(torch, dev, timer, cases, dtype, lambda: None)
        except Exception as e:  # noqa: BLE001 - this torch or GPU has no such kernel for these shapes: say so, go on
            rows[name] = [{"error": str(e).splitlines()[0][:160]}]
        if on_gpu:
            torch.cuda.empty_cache()
    info = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
            "dtype": dtype, "cases": cases}
    return {"info": info, "rows": rows}


def render(result: dict) -> str:
    info, rows = result["info"], result["rows"]
    names = list(rows)
    ok = {n: {r["seq"]: r["tflops_causal"] for r in rows[n] if "error" not in r} for n in names}
    ref = ok.get("FLASH_ATTENTION") or ok.get("MATH") or {}
    ref_name = "FLASH_ATTENTION" if ok.get("FLASH_ATTENTION") else "MATH"
    lines = [f"# SDPA backends, causal forward + backward ({info['device']}, torch {info['torch']}, {info['dtype']})", "",
             "TFLOP/s by calibrate's count (planner.calibrate.measure_attention); in brackets, over "
             f"{ref_name}'s at the same length.", "",
             "| seq | batch x heads x head_dim | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for c in info["cases"]:
        cells = []
        for n in names:
            v = ok[n].get(c["seq"])
            r = ref.get(c["seq"])
            cells.append("-" if v is None else f"{v:.4g}" + (f" ({v / r:.2f}x)" if r and n != ref_name else ""))
        lines.append(f"| {c['seq']} | {c['batch']} x {c['heads']} x {c['head_dim']} | " + " | ".join(cells) + " |")
    errors = [f"- {n}: {rows[n][0]['error']}" for n in names if rows[n] and "error" in rows[n][0]]
    if errors:
        lines += ["", "Not run:"] + errors
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="three sequence lengths, not five")
    ap.add_argument("--out", help="write the markdown here (default: print)")
    ap.add_argument("--json", help="also write the measurements as JSON here")
    a = ap.parse_args(argv)
    if a.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("error: no CUDA device here; --device cpu checks the script at small shapes", file=sys.stderr)
            return 2
    result = measure(a.device, a.quick)
    text = render(result)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    if a.out:
        Path(a.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
