"""Post-norms (ModelSpec.post_norms), or with --qk-norm q/k norms (ModelSpec.qk_norm; with --qk-norm-whole each over
the whole q or k width, ModelSpec.qk_norm_whole), or with --sliding-window a 64-token window in every other layer
(ModelSpec.sliding_window, full_attention_every 2: Gemma 2's pattern), or with --parallel-block attention and MLP
side by side on one norm (ModelSpec.parallel_block: GPT-J's, Command R's), on parplan's runtime: the CPU allocator's peak
against the memory model, with and without them, on 2 and 1 gloo ranks (uncompiled, as `parplan launch --device cpu` runs; compiled CPU
launches' peaks moved by up to 8 MiB between sittings here, so they are left out).

    OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py --out benchmarks/results/DATE-cpu-memory-post-norms
    OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py --qk-norm --out benchmarks/results/DATE-cpu-memory-qk-norms
    OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py --qk-norm-whole --out \
        benchmarks/results/DATE-cpu-memory-qk-norms-whole
    OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py --sliding-window --out \
        benchmarks/results/DATE-cpu-memory-sliding-window
    OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py --parallel-block --out \
        benchmarks/results/DATE-cpu-memory-parallel-block

Each case: `parplan recommend ... --json | parplan launch - --device cpu --steps 3 --memory-snapshot DIR`; the
table is the report's cpu_memory (the largest rank's peak without gloo's collective buffers) against its prediction."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

SHAPE = ["--layers", "4", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--ffn-hidden", "704", "--vocab", "512",
         "--seq-len", "256", "--global-batch-size", "8"]
CASES = {  # name -> layout flags
    "tp2-sp": ["--gpus", "2", "--tp", "2", "--sp"],
    "tp2-sp-selective": ["--gpus", "2", "--tp", "2", "--sp", "--recompute", "selective"],
    "tp1": ["--gpus", "1", "--tp", "1"],
}
QK_CASES = {**CASES, "tp2": ["--gpus", "2", "--tp", "2", "--no-sp"]}  # (q/k norms: partial over tp without SP too)
# (sliding windows: a cp rank's band over its two chunks' global positions, and the mask SDPA saves on the CPU)
WINDOW_CASES = {**QK_CASES, "cp2": ["--gpus", "2", "--cp", "2"]}
WINDOW = ["--sliding-window", "64", "--full-attention-every", "2"]


def run(name: str, layout: list[str], post: bool, work: Path, option: str = "post-norms") -> dict:
    cli = [sys.executable, "-m", "planner.cli"]
    off = (["--no-qk-norm"] if option == "qk-norm-whole" else [] if option == "sliding-window"
           else ["--sequential-block"] if option == "parallel-block" else [f"--no-{option}"])
    on = WINDOW if option == "sliding-window" else [f"--{option}"]
    plan = subprocess.run(cli + ["recommend", *SHAPE, *layout, *(on if post else off), "--json"],
                          capture_output=True, text=True, check=True).stdout
    out = work / f"{name}-{'with' if post else 'plain'}"
    out.mkdir(parents=True, exist_ok=True)
    report = out / "report.json"
    subprocess.run(cli + ["launch", "-", "--device", "cpu", "--steps", "3", "--memory-snapshot", str(out / "snap"),
                          "--report", str(report)], input=plan, capture_output=True, text=True, check=True)
    r = json.loads(report.read_text())
    mem = r["cpu_memory"]
    return {"case": name, option.replace("-", "_"): post, "predicted_mib": mem["predicted"] / 2**20,
            "measured_mib": mem["without_collective_buffers_max"] / 2**20, "error": mem["error"],
            "activations_mib": r["prediction"]["memory_bytes_per_gpu"]["activations"] / 2**20,
            "losses": [round(s["loss"], 6) for s in r["steps"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--qk-norm", action="store_true", help="q/k norms (ModelSpec.qk_norm) in place of post-norms")
    ap.add_argument("--qk-norm-whole", action="store_true", help="q/k norms over the whole q and k widths "
                    "(ModelSpec.qk_norm_whole: OLMo 2's) in place of post-norms")
    ap.add_argument("--sliding-window", action="store_true", help="a 64-token window in every other layer "
                    "(ModelSpec.sliding_window) in place of post-norms")
    ap.add_argument("--parallel-block", action="store_true", help="attention and MLP side by side on one norm "
                    "(ModelSpec.parallel_block) in place of post-norms")
    a = ap.parse_args()
    option, cases = (("sliding-window", WINDOW_CASES) if a.sliding_window else ("parallel-block", QK_CASES)
                     if a.parallel_block else ("qk-norm-whole", QK_CASES) if a.qk_norm_whole
                     else ("qk-norm", QK_CASES) if a.qk_norm else ("post-norms", CASES))
    key = option.replace("-", "_")
    title = {"qk-norm-whole": "Whole-width q/k norms", "qk-norm": "Q/k norms", "post-norms": "Post-norms",
             "sliding-window": "A sliding window (64 tokens, every other layer)",
             "parallel-block": "Attention and MLP side by side"}[option]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, layout in cases.items():
            for post in (False, True):
                rows.append(run(name, layout, post, Path(tmp), option))
                print(rows[-1], file=sys.stderr)
    (out / "memory.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [f"# {title} on parplan's runtime, the CPU allocator's peak ({date.today()}, {platform.machine()}, "
             f"Python {platform.python_version()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')})", "",
             f"`OMP_NUM_THREADS=1 python benchmarks/post_norms_memory.py{'' if option == 'post-norms' else ' --' + option} "
             "--out <this "
             "folder>`: llama, 4 layers, hidden 256, "
             "4 heads (2 kv), ffn 704, 256 tokens, micro-batch 8, master-weights; one run each, uncompiled; the "
             "largest rank's peak without gloo's staging buffers against `launch`'s prediction.", "",
             f"| case | {option} | predicted MiB | measured MiB | error | predicted activations MiB |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {'yes' if r[key] else 'no'} | {r['predicted_mib']:.1f} | "
                     f"{r['measured_mib']:.1f} | {r['error'] * 100:+.1f}% | {r['activations_mib']:.2f} |")
    (out / "memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
