"""Single-GPU accuracy grid: `parplan recommend ... --json | parplan launch -` for each entry, then
predicted against measured step time and peak memory (allocated and reserved), as markdown.

Every recorded GPU number must come from this pipe (issue 3/4), with the command and the report
committed.  Run on a machine with one GPU:

    python benchmarks/gpu_grid.py --out benchmarks/results/$(date +%F)-h100/grid [--only NAME ...] [--steps 12]

Writes <out>/<name>/{plan.json,report.json,command.txt} and <out>/summary.md (every report under <out>,
this call's and earlier ones'; `--summarize` rebuilds it without running anything).  Entries cover the
issues' grid: three llama sizes x micro-batch 1/4 x recompute none/full, a gpt size, selective
recompute at one size, the issue-3 MFU model (hidden 2048, 24 layers, 16 heads, 8 kv, ffn 5632,
vocab 32000, seq 2048, micro-batch 4), op-level selective recompute and eager pointwise work at 1.3B, and a
model that only fits with more recomputation than selective.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

LLAMA = {  # (layers, hidden, heads, kv_heads, ffn)
    "llama-0.5b": (16, 1536, 12, 4, 4096),
    "llama-1.3b": (24, 2048, 16, 8, 5632),
    "llama-3b": (26, 3072, 24, 8, 8192),
}


def grid() -> list[tuple[str, list[str]]]:
    out = []
    for name, (layers, hidden, heads, kv, ffn) in LLAMA.items():
        for mbs in (1, 4):
            for rec in ("none", "full"):
                out.append((f"{name}-mbs{mbs}-{rec}", [
                    "--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--kv-heads", str(kv),
                    "--ffn-hidden", str(ffn), "--vocab", "32000", "--seq-len", "2048", "--mbs", str(mbs),
                    "--global-batch-size", str(mbs), "--recompute", rec]))
    out.append(("llama-1.3b-mbs4-selective", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "8",
                                              "--ffn-hidden", "5632", "--vocab", "32000", "--seq-len", "2048",
                                              "--mbs", "4", "--global-batch-size", "4", "--recompute", "selective"]))
    out.append(("gpt-1.3b-mbs4-none", ["--arch", "gpt", "--layers", "24", "--hidden", "2048", "--heads", "16",
                                       "--kv-heads", "16", "--ffn-hidden", "8192", "--vocab", "50304",
                                       "--seq-len", "2048", "--mbs", "4", "--global-batch-size", "4",
                                       "--recompute", "none"]))
    # issue 3's MFU model, gradient accumulation 2 (the searched recompute)
    out.append(("issue3-mfu", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "8",
                               "--ffn-hidden", "5632", "--vocab", "32000", "--seq-len", "2048", "--mbs", "4",
                               "--global-batch-size", "8"]))
    # torchtitan's op-level selective checkpointing, and eager pointwise work (the plan says
    # fused_elementwise false, so launch does not compile): the two terms added 2026-11-23, not yet on a GPU
    llama13 = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "8", "--ffn-hidden", "5632",
               "--vocab", "32000", "--seq-len", "2048", "--mbs", "4", "--global-batch-size", "4"]
    out.append(("llama-1.3b-mbs4-selective-op", llama13 + ["--recompute", "selective-op"]))
    out.append(("llama-1.3b-mbs4-none-eager", llama13 + ["--recompute", "none", "--no-fused-elementwise"]))
    # gradient clipping (on by default since 2026-11-23): the same run without it, for the clipping passes'
    # share of the after-backward phase (cost_models.compute.grad_clip_time)
    out.append(("llama-1.3b-mbs4-none-noclip", llama13 + ["--recompute", "none", "--clip-grad", "0"]))
    # gradient-accumulation fusion (parplan's runtime since 2026-11-24, not yet on a GPU): eight micro-batches of one,
    # the weight gradients added into main_grad by the GEMM, and the same plan predicted and run with the upcast pass
    accum8 = llama13[:-4] + ["--mbs", "1", "--global-batch-size", "8", "--recompute", "none"]
    out.append(("llama-1.3b-mbs1-accum8", accum8))
    out.append(("llama-1.3b-mbs1-accum8-unfused", accum8 + ["--no-grad-accumulation-fusion"]))
    # fp16 with the runtime's dynamic loss scale (parallel_layers.loss_scale, 2026-12-03, checked on CPU only): fp16
    # weights with fp32 masters, the fused weight-gradient GEMM on fp16 operands, the check-and-unscale pass counted
    # (cost_models.compute.loss_scale_time); the report says which steps, if any, overflowed
    out.append(("llama-1.3b-mbs4-none-fp16", llama13 + ["--recompute", "none", "--dtype", "fp16"]))
    # dropout (parallel_layers.dropout, 2026-12-03, checked on CPU only): the gpt above with Megatron's 0.1 on the
    # embedding, the attention probabilities (inside the flash kernel) and both residual branches, 1-byte masks kept;
    # compiled: since 2026-12-04 (after that day's H200 run of this entry) the hidden masks are hashed inside the
    # blocks' graphs, the attention's dropout stays outside them (launch says the prediction counts Megatron's fused
    # bias-dropout-add)
    gpt13 = next(a for n, a in out if n == "gpt-1.3b-mbs4-none")
    out.append(("gpt-1.3b-mbs4-none-dropout", gpt13 + ["--dropout"]))
    # FP8 linears (parallel_layers.fp8, the twenty-first session, checked on CPU only): the two GPU-bound llama runs
    # above with the blocks' GEMMs in FP8 (torch._scaled_mm, tensor-wise scales), their casts compiled
    llama3b = next(a for n, a in out if n == "llama-3b-mbs4-none")
    out.append(("llama-3b-mbs4-none-fp8", llama3b + ["--fp8"]))
    out.append(("llama-1.3b-mbs4-none-fp8", next(a for n, a in out if n == "llama-1.3b-mbs4-none") + ["--fp8"]))
    # a mixture of experts on parplan's runtime (parallel_layers.moe, the twenty-fifth session, checked on CPU only):
    # one GPU, so ep 1 and no all-to-all; the block eager (not compiled), each expert's GEMMs on its share of the
    # tokens (balanced routing, --moe-balanced-routing, as predicted): 16 experts of ffn 1408, top 2 (Qwen1.5-MoE's
    # expert shape at hidden 2048), and 8 of ffn 2816
    moe = ["--layers", "16", "--hidden", "2048", "--heads", "16", "--kv-heads", "8", "--vocab", "32000",
           "--seq-len", "2048", "--mbs", "2", "--global-batch-size", "2", "--recompute", "none"]
    out.append(("moe-2.5b-e16-mbs2", moe + ["--ffn-hidden", "1408", "--experts", "16", "--experts-per-token", "2"]))
    out.append(("moe-2.4b-e8-mbs2", moe + ["--ffn-hidden", "2816", "--experts", "8", "--experts-per-token", "2"]))
    # dense blocks between the MoE ones (the twenty-sixth session, CPU only): the 16-expert model with its first two
    # blocks a dense SwiGLU of 5632 (GLM-4.5's and DeepSeek-V3's placement)
    out.append(("moe-mixed-2.4b-e16-mbs2", moe + ["--ffn-hidden", "1408", "--experts", "16", "--experts-per-token", "2",
                                                  "--first-dense-layers", "2", "--dense-ffn", "5632"]))
    # multi-head latent attention on parplan's runtime (parallel_layers.model.MLAttention, the twenty-seventh session,
    # CPU only): DeepSeek-V2-Lite's attention widths (kv latent 512, head_dim 128 + 64, values 128, padded to 192 for
    # the fused kernel) on the dense 1.3B-class llama's blocks, and the mixed MoE model above with them
    out.append(("mla-1.3b-mbs4", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "16",
                                  "--head-dim", "192", "--kv-lora-rank", "512", "--q-lora-rank", "768",
                                  "--qk-rope-dim", "64", "--v-head-dim", "128", "--ffn-hidden", "5632",
                                  "--vocab", "32000", "--seq-len", "2048", "--mbs", "4", "--global-batch-size", "4",
                                  "--recompute", "none"]))
    # its up projections rebuilt for the attention kernel's backward (training.mla_recompute, Megatron's mla_up_proj;
    # the twenty-eighth session, CPU only): the memory it frees and the GEMMs it runs again, on a GPU's fused kernel
    out.append(("mla-1.3b-mbs4-uprecompute", out[-1][1] + ["--mla-recompute"]))
    out.append(("mla-moe-mixed-2.4b-e16-mbs2", [a for a in moe if a not in ("--kv-heads", "8")]
                + ["--kv-heads", "16", "--head-dim", "192", "--kv-lora-rank", "512", "--qk-rope-dim", "64",
                   "--v-head-dim", "128", "--ffn-hidden", "1408", "--experts", "16", "--experts-per-token", "2",
                   "--first-dense-layers", "2", "--dense-ffn", "5632"]))
    # OLMo 2's block on parplan's runtime (the fifty-second session, CPU only): q/k norms over the whole q and k widths
    # (one GPU: tp 1, so no statistics all-reduce) and the two norms on the sublayers' outputs, on the 1.3B llama's
    # shape (MHA, as OLMo 2): the compiled blocks with the new norms, their step and memory
    out.append(("olmo2-1.3b-mbs4", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "16",
                                    "--ffn-hidden", "5632", "--vocab", "32000", "--seq-len", "2048", "--mbs", "4",
                                    "--global-batch-size", "4", "--recompute", "none", "--qk-norm-whole",
                                    "--norms-after"]))
    # a sliding window on parplan's runtime (the fifty-third session, CPU only until a GPU runs it): FlexAttention under
    # the band's block mask in the compiled blocks (parallel_layers.window), every other layer within 1,024 of 8,192
    # tokens (Gemma 2's pattern), the 1.3B llama's shape: whether the kernel skips the tiles the prediction leaves out
    out.append(("window-1.3b-8k", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "16",
                                   "--ffn-hidden", "5632", "--vocab", "32000", "--seq-len", "8192", "--mbs", "1",
                                   "--global-batch-size", "1", "--recompute", "none", "--sliding-window", "1024",
                                   "--full-attention-every", "2"]))
    # fits one H100 only with more than selective recomputation (the planner must choose it)
    out.append(("needs-recompute", ["--layers", "32", "--hidden", "3072", "--heads", "24", "--kv-heads", "8",
                                    "--ffn-hidden", "8192", "--vocab", "32000", "--seq-len", "4096", "--mbs", "4",
                                    "--global-batch-size", "4"]))
    return out


def run_entry(name: str, args: list[str], out: Path, steps: int, hardware: str | None = None,
              snapshot: bool = False, profile: bool = False) -> dict:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    rec = [sys.executable, "-m", "planner.cli", "recommend", *args, "--gpus", "1", "--zero", "0", "--json"]
    if hardware:
        rec += ["--hardware", hardware]
    launch = [sys.executable, "-m", "planner.cli", "launch", "-", "--steps", str(steps), "--device", "cuda",
              "--report", str(d / "report.json")]
    if snapshot:
        launch += ["--memory-snapshot", str(d / "snapshot")]
    if profile:  # one step more, under torch.profiler: <run>/profile/rank0.ops.md says which kernels took the step
        launch += ["--profile", str(d / "profile")]
    if "--experts" in args:  # every expert its share of the tokens, as the prediction assumes
        launch += ["--moe-balanced-routing"]
    (d / "command.txt").write_text(shlex.join(rec) + " | " + shlex.join(launch) + "\n")
    t0 = time.time()
    plan = subprocess.run(rec, capture_output=True, text=True)
    if plan.returncode != 0:
        # launch writes plan.json itself, and refuses a folder whose plan.json holds another plan (its
        # own serialisation can differ from recommend's stdout), so recommend's output is kept only on failure
        (d / "recommend.json").write_text(plan.stdout)
        return {"name": name, "error": f"recommend exit {plan.returncode}: {plan.stderr.strip()[-300:]}"}
    job = subprocess.run(launch, input=plan.stdout, capture_output=True, text=True)
    (d / "launch.log").write_text(job.stderr)
    if job.returncode != 0:
        return {"name": name, "error": f"launch exit {job.returncode}: {job.stderr.strip()[-300:]}"}
    rep = json.loads((d / "report.json").read_text())
    return summarize(name, rep, time.time() - t0)


def _median_field(steps: list[dict], key: str):
    vals = [s[key] for s in steps if s.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(name: str, rep: dict, wall: float) -> dict:
    steps = rep["steps"][rep["warmup_steps"]:]
    pred = rep["prediction"]
    par = rep["plan"]["parallel"]
    measured_step = statistics.median(s["step_time_s"] for s in steps)
    mfu = statistics.median(s["mfu"] for s in steps if s["mfu"] is not None) if steps and steps[0]["mfu"] else None
    peaks = rep["peak_memory_bytes"]  # {rank: {"allocated", "reserved"}}
    peak = max(peaks.values() if isinstance(peaks, dict) else peaks, key=lambda m: m["reserved"] or 0)
    return {"name": name, "recompute": par["recompute"], "mbs": rep["plan"]["training"]["micro_batch_size"],
            "pred_step_s": pred["step_time_s"], "step_s": measured_step,
            "pred_mem": pred["memory_bytes_per_gpu"]["total"], "allocated": peak["allocated"],
            "reserved": peak["reserved"], "pred_mfu": pred["mfu"], "mfu": mfu, "wall_s": wall,
            **{k: _median_field(steps, k) for k in ("host_dispatch_s", "fwd_bwd_s", "after_s")}}


def table(rows: list[dict]) -> list[str]:
    def pct(p, m):
        return "-" if not m else f"{(p - m) / m:+.1%}"
    lines = ["| run | recompute | mbs | step pred s | step meas s | err | mem pred GB | alloc GB | reserved GB | err vs reserved | MFU pred | MFU meas | host dispatch s | fwd+bwd s | after s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:120]} |")
            continue
        measured_mfu = "-" if r["mfu"] is None else f"{r['mfu']:.3f}"
        lines.append(f"| {r['name']} | {r['recompute']} | {r['mbs']} | {r['pred_step_s']:.4f} | {r['step_s']:.4f} | "
                     f"{pct(r['pred_step_s'], r['step_s'])} | {r['pred_mem'] / 1e9:.2f} | {r['allocated'] / 1e9:.2f} | "
                     f"{r['reserved'] / 1e9:.2f} | {pct(r['pred_mem'], r['reserved'])} | {r['pred_mfu']:.3f} | "
                     f"{measured_mfu} | " + " | ".join("-" if r.get(k) is None else f"{r[k]:.4f}"
                                                  for k in ("host_dispatch_s", "fwd_bwd_s", "after_s")) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hardware", help="hardware profile name or TOML path for the predictions (default: recommend's)")
    ap.add_argument("--memory-snapshot", action="store_true",
                    help="record each run's allocator history (<run>/snapshot/; slows the run: memory diagnosis only)")
    ap.add_argument("--profile", action="store_true",
                    help="each run profiles one step after its measured ones (<run>/profile/: launch --profile)")
    ap.add_argument("--summarize", action="store_true",
                    help="run nothing: rebuild summary.md from the reports already under --out")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = dict(grid())
    unknown = [n for n in a.only or () if n not in entries]
    if unknown:
        ap.error(f"no grid entry {', '.join(unknown)}; the entries: {', '.join(entries)}")
    rows = []
    for name in a.only or entries:  # --only's order: a call short of time runs the entries it names first
        args = entries[name]
        if a.summarize:
            rep = out / name / "report.json"
            if rep.exists():
                rows.append(summarize(name, json.loads(rep.read_text()), float("nan")))
            continue
        try:
            r = run_entry(name, args, out, a.steps, a.hardware, a.memory_snapshot, a.profile)
        except Exception as e:  # one broken run must not lose the rest of the grid
            r = {"name": name, "error": f"{type(e).__name__}: {e}"}
        rows.append(r)
        print(json.dumps(r), flush=True)
    # the summary covers every report under --out, not only this call's entries (a later --only call had left
    # the others out of summary.md)
    done = {r["name"]: r for r in rows}
    rows = [done[name] if name in done else summarize(name, json.loads((out / name / "report.json").read_text()),
                                                      float("nan"))
            for name, _ in grid() if name in done or (out / name / "report.json").exists()]
    head = [f"# single-GPU grid, {datetime.date.today()}" + (" (summary rebuilt from the reports under this folder; the "
                                                             "runs' dates are in their reports)" if a.summarize else ""), "",
            "`python benchmarks/gpu_grid.py` (each run: the command in <run>/command.txt; the report beside it).",
            "Medians over the steps after warm-up; memory error is against the largest reserved peak. "
            "'pred' is the prediction the plan carried at launch; `benchmarks/gpu_accuracy.py` re-predicts "
            "every report with the current cost model.", ""]
    (out / "summary.md").write_text("\n".join(head + table(rows)) + "\n")
    print(f"wrote {out / 'summary.md'}")


if __name__ == "__main__":
    main()
