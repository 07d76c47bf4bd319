"""A mixture of experts on parplan's runtime: the memory model against the CPU allocator's peak (4 gloo ranks), per
layout, with the routing balanced as the model assumes (``--moe-balanced-routing``: every expert the same share of a
rank's tokens).

    OMP_NUM_THREADS=1 python benchmarks/moe_memory.py --out benchmarks/results/DATE-cpu-memory-moe [--precision fp32]

One 4-rank torchrun of every plan with ``--memory-snapshot`` (parallel_layers/host_memory.py), as
benchmarks/cpu_memory.py runs the dense layouts: the narrow model of tests/test_runtime_memory.py's SCHEDULES with
4 SwiGLU experts of its ffn, top 2 (activations dominate), and its wide model likewise (model states dominate: the
experts' split over ep).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.core import evaluate_plan  # noqa: E402
from tests.runtime_helpers import suite  # noqa: E402
from tests.runtime_helpers.plans import tiny_plan, write_plan  # noqa: E402
from tests.test_runtime_memory import NARROW, WIDE  # noqa: E402

MOE = {"experts": 4, "experts_per_token": 2}
# dense blocks between the MoE ones (ModelSpec.first_dense_layers / moe_layer_step), a dense MLP twice the expert's width
MIXED = {"narrow-mixed": {"first_dense_layers": 2, "dense_ffn_hidden": 2 * NARROW["ffn_hidden"]},
         "wide-mixed": {"first_dense_layers": 1, "dense_ffn_hidden": 2 * WIDE["ffn_hidden"]},
         "wide-step2": {"moe_layer_step": 2, "dense_ffn_hidden": 2 * WIDE["ffn_hidden"]},
         # multi-head latent attention (parallel_layers.model.MLAttention) before the experts, DeepSeek-V3's layout in
         # small: heads of 96 (64 no-rope + 32 rotary), values of 64, latents of 192 (query) and 128 (key/value), the
         # first block dense; and DeepSeek-V2-Lite's full query projection
         "narrow-mla": {"head_dim": 96, "qk_rope_head_dim": 32, "v_head_dim": 64, "kv_lora_rank": 128,
                        "q_lora_rank": 192, "first_dense_layers": 1, "dense_ffn_hidden": 2 * NARROW["ffn_hidden"]},
         "narrow-mla-no-q-lora": {"head_dim": 96, "qk_rope_head_dim": 32, "v_head_dim": 64, "kv_lora_rank": 128,
                                  "first_dense_layers": 1, "dense_ffn_hidden": 2 * NARROW["ffn_hidden"]},
         # a shared expert beside the routed ones (a tensor-parallel SwiGLU of the expert's width)
         "narrow-shared": {"shared_expert_ffn": NARROW["ffn_hidden"]}}
# name -> (model, parallel[, Training fields]); 4 ranks each, master-weights
NARROW_TRAINING = dict(seq_len=512, micro_batch_size=2, global_batch_size=16)
WIDE_TRAINING = dict(seq_len=32, micro_batch_size=1, global_batch_size=8)
CASES = {
    "pp4-1f1b": ("narrow", dict(tp=1, pp=4, dp=1, schedule="1f1b")),
    "pp4-1f1b-selective": ("narrow", dict(tp=1, pp=4, dp=1, schedule="1f1b", recompute="selective")),
    "pp4-1f1b-full": ("narrow", dict(tp=1, pp=4, dp=1, schedule="1f1b", recompute="full")),
    "pp2-dp2-ep2-1f1b": ("narrow", dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b")),
    "pp2-dp2-ep2-zbv": ("narrow", dict(tp=1, pp=2, dp=2, ep=2, schedule="zbv", vpp=2)),
    "dp4-ep4": ("narrow", dict(tp=1, pp=1, dp=4, ep=4)),
    "tp2-sp-dp2-ep4": ("narrow", dict(tp=2, pp=1, dp=2, ep=4, sp=True)),
    "wide-dp4-ep4": ("wide", dict(tp=1, pp=1, dp=4, ep=4)),
    "wide-pp2-dp2-ep2": ("wide", dict(tp=1, pp=2, dp=2, ep=2)),
    # ZeRO-1: the experts' states split over their expert-data-parallel group (2 ranks), the rest over dp (4)
    "wide-dp4-ep2-zero1": ("wide", dict(tp=1, pp=1, dp=4, ep=2, zero_stage=1)),
    # dense blocks between (MIXED): the narrow model's first two blocks dense (pipeline rank 0 holds them beside two MoE
    # blocks), the wide model's first, and the wide model's every other block
    "mixed-pp2-dp2-ep2-1f1b": ("narrow-mixed", dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b")),
    "mixed-dp4-ep4": ("narrow-mixed", dict(tp=1, pp=1, dp=4, ep=4)),
    "wide-mixed-pp2-dp2-ep2": ("wide-mixed", dict(tp=1, pp=2, dp=2, ep=2)),
    "wide-mixed-step2-dp4-ep2-zero1": ("wide-step2", dict(tp=1, pp=1, dp=4, ep=2, zero_stage=1)),
    # multi-head latent attention (MIXED's narrow-mla*): the latents on every rank whole (dp), gathered over tp by SP,
    # and in a pipeline with the attention core checkpointed
    "mla-dp4-ep4": ("narrow-mla", dict(tp=1, pp=1, dp=4, ep=4)),
    "mla-tp2-sp-dp2-ep4": ("narrow-mla", dict(tp=2, pp=1, dp=2, ep=4, sp=True)),
    "mla-no-q-lora-pp2-dp2-ep2-1f1b-selective": ("narrow-mla-no-q-lora", dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b",
                                                                              recompute="selective")),
    # ... under context parallelism (the fifty-second session): the padded keys and values gathered over cp and kept
    # for the backward, or under selective recompute gathered again inside the core's checkpoint
    "mla-cp2-dp2-ep2": ("narrow-mla", dict(tp=1, pp=1, dp=2, cp=2, ep=2)),
    "mla-cp2-tp2-sp-ep2": ("narrow-mla", dict(tp=2, pp=1, dp=1, cp=2, ep=2, sp=True)),
    "mla-cp2-dp2-ep2-selective": ("narrow-mla", dict(tp=1, pp=1, dp=2, cp=2, ep=2, recompute="selective")),
    # and its up projections recomputed (training.mla_recompute: MLAttention rebuilds the kernel's q, k, v from the
    # latents, or under selective runs the up projections inside the core's checkpoint): the same layouts
    "mla-recompute-dp4-ep4": ("narrow-mla", dict(tp=1, pp=1, dp=4, ep=4), {"mla_recompute": True}),
    "mla-recompute-tp2-sp-dp2-ep4": ("narrow-mla", dict(tp=2, pp=1, dp=2, ep=4, sp=True), {"mla_recompute": True}),
    "mla-recompute-no-q-lora-pp2-dp2-ep2-1f1b-selective": ("narrow-mla-no-q-lora",
                                                           dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b",
                                                                recompute="selective"), {"mla_recompute": True}),
    # a mixture of experts' recompute modules (training.moe_recompute, Megatron-LM's --recompute-modules moe_act and
    # layernorm moe_act: the experts' activation output, and the pre-MLP norm's, rebuilt for the backward by
    # parallel_layers.model.Block), each beside the same layout without them (named alike: `--only moe-rec` runs
    # both, and the README gives what each frees): expert parallelism over dp, over tp with SP and a shared expert
    # (whose input the norm's output is too), and in a ZB-V pipeline under selective recompute; and every rank's experts
    # its own (ep 1: no all-to-all, whose gloo transfers leave a few MiB of dispatched tokens live at varying moments)
    "moe-rec-dp4": ("narrow", dict(tp=1, pp=1, dp=4)),
    "moe-rec-act-dp4": ("narrow", dict(tp=1, pp=1, dp=4), {"moe_recompute": "act"}),
    "moe-rec-norm-act-dp4": ("narrow", dict(tp=1, pp=1, dp=4), {"moe_recompute": "norm-act"}),
    "moe-rec-dp4-ep4": ("narrow", dict(tp=1, pp=1, dp=4, ep=4)),
    "moe-rec-act-dp4-ep4": ("narrow", dict(tp=1, pp=1, dp=4, ep=4), {"moe_recompute": "act"}),
    "moe-rec-norm-act-dp4-ep4": ("narrow", dict(tp=1, pp=1, dp=4, ep=4), {"moe_recompute": "norm-act"}),
    "moe-rec-shared-tp2-sp-dp2-ep4": ("narrow-shared", dict(tp=2, pp=1, dp=2, ep=4, sp=True)),
    "moe-rec-norm-act-shared-tp2-sp-dp2-ep4": ("narrow-shared", dict(tp=2, pp=1, dp=2, ep=4, sp=True),
                                               {"moe_recompute": "norm-act"}),
    "moe-rec-pp2-dp2-ep2-zbv-selective": ("narrow", dict(tp=1, pp=2, dp=2, ep=2, schedule="zbv", vpp=2,
                                                         recompute="selective")),
    "moe-rec-act-pp2-dp2-ep2-zbv-selective": ("narrow", dict(tp=1, pp=2, dp=2, ep=2, schedule="zbv", vpp=2,
                                                             recompute="selective"), {"moe_recompute": "act"}),
    # ZeRO-2 (parplan's runtime since 2026-12-05): the experts' gradients reduced to their owner in their
    # expert-data-parallel group (2 ranks) and their states split over it, the rest's over dp (4); the wide model's
    # states dominate, and the narrow one with tp 2 and SP
    "zero2-wide-dp4-ep2": ("wide", dict(tp=1, pp=1, dp=4, ep=2, zero_stage=2)),
    "zero2-tp2-sp-dp2-ep2": ("narrow", dict(tp=2, pp=1, dp=2, ep=2, sp=True, zero_stage=2)),
    # ZeRO-3 (parplan's runtime since 2026-12-05, torchtitan's FSDP2 layout): the dense weights, gradients and states
    # sharded over dp (4), each MoE layer's experts an FSDP2 unit of their own over their expert-data-parallel group
    # (2 ranks at ep 2, none at ep 4), gathered for their forward and backward; the wide model's states dominate, the
    # narrow one with tp 2 and SP, and the wide one inside a pipeline (FSDP2 keeps the gathered weights through the step)
    "zero3-wide-dp4-ep2": ("wide", dict(tp=1, pp=1, dp=4, ep=2, zero_stage=3)),
    "zero3-wide-dp4-ep4": ("wide", dict(tp=1, pp=1, dp=4, ep=4, zero_stage=3)),
    "zero3-tp2-sp-dp2-ep2": ("narrow", dict(tp=2, pp=1, dp=2, ep=2, sp=True, zero_stage=3)),
    "zero3-wide-pp2-dp2-ep2": ("wide", dict(tp=1, pp=2, dp=2, ep=2, zero_stage=3)),
    # hybrid sharding with experts (since 2026-12-07): dp 4 as 2 replica groups of 2, the dense states over a group's 2;
    # the experts' over a group's share of their expert-data-parallel group (2 of 4 at ep 1; 1 of 2 at ep 2: whole on
    # each rank, all-reduced across the groups)
    "hsdp-wide-dp4-ep1": ("wide", dict(tp=1, pp=1, dp=4, ep=1, zero_stage=3, dp_replicate=2)),
    "hsdp-wide-dp4-ep2": ("wide", dict(tp=1, pp=1, dp=4, ep=2, zero_stage=3, dp_replicate=2)),
}
MIB = 2**20


def jobs(tmp: Path, steps: int = 2, precision: str = "master-weights", only: str = "") -> list[dict]:
    out = []
    for name, (kind, par, *extra) in CASES.items():
        if only not in name:
            continue
        narrow = kind.startswith("narrow")
        model = {**(NARROW if narrow else WIDE), **MOE, **MIXED.get(kind, {})}
        training = dict(NARROW_TRAINING if narrow else WIDE_TRAINING)
        if par.get("pp", 1) == 1:  # as test_runtime_memory's dp layouts: two micro-batches a replica
            training["global_batch_size"] = 2 * training["micro_batch_size"] * par["dp"]
        plan = tiny_plan(model, precision=precision, **training, **par)
        if extra:
            plan = plan.model_copy(update={"training": plan.training.model_copy(update=extra[0])})
        plan = evaluate_plan(plan)
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        out.append({"plan": write_plan(plan, d / "plan.json"), "report": str(d / "report.json"),
                    "opts": {"steps": steps, "device": "cpu", "memory_snapshot": str(d / "trace"),
                             "moe_balanced_routing": True}})
    return out


def drops(tmp: Path, names: list[str]) -> list[str]:
    """The README's table of what a plan's recompute modules (its Training fields) free: against the run's plan of the
    same model and layout without them, the predicted and measured peaks' differences."""
    rows = []
    for name in names:
        kind, par, *extra = CASES[name]
        base = next((n for n in names if CASES[n][:2] == (kind, par) and len(CASES[n]) == 2), None)
        if not extra or base is None:
            continue
        cm, cm0 = (json.loads((tmp / n / "report.json").read_text())["cpu_memory"] for n in (name, base))
        pred, meas = cm0["predicted"] - cm["predicted"], (cm0["without_collective_buffers_max"]
                                                        - cm["without_collective_buffers_max"])
        rows.append(f"| {name} | {base} | {', '.join(f'{k} {v}' for k, v in extra[0].items())} | {pred / MIB:.2f} | "
                    f"{meas / MIB:.2f} |")
    if not rows:
        return []
    return ["", "What the recompute modules free (the same run's plan without them less the plan with them):", "",
            "| plan | against | training | predicted drop MiB | measured drop MiB |", "|---|---|---|---|---|", *rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--precision", choices=["master-weights", "fp32"], default="master-weights",
                    help="every plan's recipe (the CPU runs both in the GPU's storage dtypes)")
    ap.add_argument("--only", default="", help="the plans whose name contains this (default: all)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="parplan-moe-memory-"))
    todo = jobs(tmp, precision=a.precision, only=a.only)
    r = suite.run_jobs(todo, 4, tmp, "memory", timeout=1500)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
        return 1
    lines = [f"# A mixture of experts on parplan's runtime, 4 gloo ranks ({datetime.date.today()}, {platform.machine()}, "
             f"Python {platform.python_version()})", "",
             f"`OMP_NUM_THREADS=1 python benchmarks/moe_memory.py --out <this folder> --precision {a.precision}"
             + (f" --only {a.only}" if a.only else "") + "`: "
             "one run of each plan "
             f"({a.precision}, balanced routing), the CPU allocator's peak without gloo's staging buffers (the "
             "largest rank's), against `evaluate`'s total.  Narrow: llama, 8 layers, hidden 256, 4 experts of ffn "
             "704, top 2, seq 512, micro-batch 2.  Wide: 4 layers, hidden 1024, 4 experts of ffn 2816, top 2, seq 32.  "
             "Mixed: the first blocks (narrow 2, wide 1), or every other block (step2), a dense SwiGLU twice the "
             "expert's width.  Shared: narrow with a shared expert of the expert's width.",
             "", "| plan | predicted MiB | measured MiB | error | step losses |", "|---|---|---|---|---|"]
    errors = {}
    for name in (n for n in CASES if a.only in n):
        rep = json.loads((tmp / name / "report.json").read_text())
        cm = rep["cpu_memory"]
        errors[name] = cm["error"]
        losses = ", ".join(f"{s['loss']:.6f}" for s in rep["steps"])
        lines.append(f"| {name} | {cm['predicted'] / MIB:.1f} | {cm['without_collective_buffers_max'] / MIB:.1f} | "
                     f"{cm['error']:+.1%} | {losses} |")
    lines += ["", f"|error| median {sorted(abs(e) for e in errors.values())[len(errors) // 2]:.1%}, "
              f"max {max(abs(e) for e in errors.values()):.1%} over {len(errors)} plans."]
    lines += drops(tmp, [n for n in CASES if a.only in n])
    (out / "README.md").write_text("\n".join(lines) + "\n")
    (out / "errors.json").write_text(json.dumps(errors, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
