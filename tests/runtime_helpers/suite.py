"""The multi-rank comparison suite as data: one-rank reference jobs and 8-rank jobs, each run in
a single torchrun invocation by ``run_jobs``; tests read the reports and gradient dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan, write_plan

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
PROFILED = "1f1b"  # the parallel case run with --profile (its step STEPS + 1 profiled on every rank)
LAYOUT = dict(tp=2, pp=2, dp=2)

# the dropout cases' options where only the hidden dropout is compared (parallel_layers.dropout): blocks of 8 tokens,
# which divide every split of the suite's 32-token sequences
DROPOUT_HIDDEN_ONLY = {"attention_dropout": 0.0, "dropout_block_tokens": 8}
DROPOUT_HASH = {"attention_dropout": 0.0, "dropout_masks": "hash"}  # the hidden dropout's hash masks, alone
# name -> (model, parallel overrides, options); all 8-rank, tp2 x pp2 x dp2 unless overridden
PARALLEL_CASES = {
    "1f1b": (TINY_LLAMA, dict(schedule="1f1b"), {}),
    "gpipe": (TINY_LLAMA, dict(schedule="gpipe"), {}),
    "uneven-stages": (TINY_LLAMA, dict(schedule="1f1b", stage_layers=[1, 3]), {}),
    "interleaved-1f1b": (TINY_LLAMA, dict(schedule="interleaved-1f1b", vpp=2), {}),
    "interleaved-zb": (TINY_LLAMA, dict(schedule="interleaved-zb", vpp=2), {}),
    "zbv": (TINY_LLAMA, dict(schedule="zbv", vpp=2), {}),
    "zero1": (TINY_LLAMA, dict(zero_stage=1), {}),
    "zero2": (TINY_LLAMA, dict(zero_stage=2), {}),
    "fsdp2": (TINY_LLAMA, dict(zero_stage=3), {}),
    "sp": (TINY_LLAMA, dict(sp=True), {}),
    # SP's column-parallel inputs gathered again in the backward, inside the full-recompute checkpoint
    "sp-full": (TINY_LLAMA, dict(sp=True, recompute="full"), {}),
    "selective": (TINY_LLAMA, dict(recompute="selective"), {}),
    "full": (TINY_LLAMA, dict(recompute="full"), {}),
    # torchtitan's op-level selective checkpointing (parallel_layers.model.op_sac_context): the recompute
    # re-runs SP's gathers and scatters and the unsaved matmuls inside FSDP2's gathered block
    "sp-fsdp2-selective-op": (TINY_LLAMA, dict(sp=True, zero_stage=3, recompute="selective-op"), {}),
    "zb-sp-fsdp2-full": (TINY_LLAMA, dict(schedule="interleaved-zb", vpp=2, sp=True, zero_stage=3, recompute="full"), {}),
    # whole-block recompute under the zero-bubble schedules (whose linears queue their weight gradients,
    # layers.WeightGradStore, for the weight pass to run): SP's gather of the input again in it
    "zbv-sp-full": (TINY_LLAMA, dict(schedule="zbv", vpp=2, sp=True, recompute="full"), {}),
    "interleaved-zb-selective-op": (TINY_LLAMA, dict(schedule="interleaved-zb", vpp=2, recompute="selective-op"), {}),
    "gpt-tied": (TINY_GPT, dict(schedule="1f1b"), {}),
    "gpt-tied-sp-zbv": (TINY_GPT, dict(schedule="zbv", vpp=2, sp=True, recompute="selective"), {}),
    "gpt-tied-fsdp2-gpipe": (TINY_GPT, dict(schedule="gpipe", zero_stage=3, sp=True), {}),
    "pp4-dp2-interleaved": (TINY_LLAMA, dict(tp=1, pp=4, dp=2, schedule="interleaved-1f1b", vpp=2,
                                             stage_layers=[1, 0, 1, 0, 0, 1, 0, 1]), {}),
    "tp2-dp4-sp-zero1": (TINY_LLAMA, dict(tp=2, pp=1, dp=4, sp=True, zero_stage=1), {}),
    "gpt-untied-interleaved-zb": ({**TINY_GPT, "tied_embeddings": False}, dict(schedule="interleaved-zb", vpp=2), {}),
    # a vocabulary tp does not divide (GPT-2's 50257 is odd): padded to a multiple of tp, the padding's
    # logits masked; tied, so the last stage's copy of the embedding is padded and summed too
    "gpt-tied-odd-vocab": ({**TINY_GPT, "vocab": 257}, dict(schedule="1f1b"), {}),
    # the fused cross-entropy (layers.fused_vocab_parallel_cross_entropy: logits and their gradient in their own
    # dtype, chunked fp32 upcasts) over tp 2 with the padded vocabulary, against the one-rank autograd loss
    "gpt-tied-odd-vocab-fused-loss": ({**TINY_GPT, "vocab": 257}, dict(schedule="1f1b", fused_loss=True), {}),
    # llama with tied embeddings (Llama 3.2 1B/3B, Gemma): the last stage's head is a copy of the
    # embedding whose gradient is summed with it, as gpt's; ZB-V puts both copies on pp rank 0
    "llama-tied-1f1b-sp": ({**TINY_LLAMA, "tied_embeddings": True}, dict(schedule="1f1b", sp=True), {}),
    "llama-tied-zbv-zero1": ({**TINY_LLAMA, "tied_embeddings": True}, dict(schedule="zbv", vpp=2, zero_stage=1), {}),
    "sgd": (TINY_LLAMA, dict(), {"optimizer": "sgd"}),
    # optimizer offload: AdamW states on the host, step on the CPU (MasterAdamW as a host mirror)
    "zero1-offload": (TINY_LLAMA, dict(zero_stage=1, offload="optimizer"), {}),
    "fsdp2-offload": (TINY_LLAMA, dict(zero_stage=3, offload="optimizer"), {}),  # FSDP2 CPUOffloadPolicy
    # bf16 parameters + fp32 main_grad + sharded fp32 masters, with the tied-embedding (pp) and
    # sequence-parallel (tp) gradient sums on main_grad; compared with the one-rank
    # master-weights run at the bf16 tolerances of test_runtime_multirank
    "gpt-tied-master-weights-zero2-sp": (TINY_GPT, dict(zero_stage=2, sp=True, precision="master-weights"), {}),
    # gradient-accumulation fusion (the linears' dW added into main_grad by the GEMM; its reference arithmetic on
    # the CPU): SP's gathered linears, the row-parallel ones, the tied head's copy on the last stage, inside the
    # full-recompute checkpoint, then ZeRO-1's split states
    "gpt-tied-master-weights-fused-zero1-sp-full": (TINY_GPT, dict(zero_stage=1, sp=True, recompute="full",
                                                                   precision="master-weights", fused_loss=True),
                                                    {"wgrad_fusion": "reference"}),
    # zero-bubble weight gradients bypass the main_grad hook and are folded in after the schedule
    "gpt-tied-master-weights-zbv": (TINY_GPT, dict(schedule="zbv", vpp=2, precision="master-weights"), {}),
    # and so are the queued ones (WeightGradStore), under full recompute, with the weight-gradient GEMM adding into
    # main_grad inside the queued closures (its reference arithmetic on the CPU)
    "gpt-tied-master-weights-fused-zbv-full": (TINY_GPT, dict(schedule="zbv", vpp=2, precision="master-weights",
                                                              recompute="full"), {"wgrad_fusion": "reference"}),
    # FSDP2 MixedPrecisionPolicy(bf16 params, bf16 reduce) over fp32 shards
    "gpt-tied-half-grads-fsdp2-gpipe-sp": (TINY_GPT, dict(schedule="gpipe", zero_stage=3, sp=True,
                                                          precision="master-weights-half-grads"), {}),
    # context parallelism (load-balanced all-gather CP): GQA llama over cp x tp x dp (ZeRO-0 over
    # the flattened dp x cp group; it also writes the checkpoint CP_RESUME resumes); gpt with
    # learned positions, SP inside TP, a zero-bubble schedule (split dI/dW backward), selective
    # recompute and ZeRO-1 (cp replicas averaged after the dp reduction); cp4 with FSDP2 (shards
    # over dp, cp replicas averaged) and full recompute (the K/V gather runs again in the backward)
    "cp2-tp2-dp2": (TINY_LLAMA, dict(tp=2, pp=1, dp=2, cp=2), {}),
    "gpt-tied-cp2-pp2-tp2-sp-zbv": (TINY_GPT, dict(tp=2, pp=2, dp=1, cp=2, sp=True, schedule="zbv", vpp=2,
                                                   recompute="selective", zero_stage=1), {}),
    "cp4-dp2-fsdp2-full": (TINY_LLAMA, dict(tp=1, pp=1, dp=2, cp=4, zero_stage=3, recompute="full"), {}),
    # ZeRO-3's hybrid sharding: FSDP2 over a (2 replicas, 2 shards) mesh of the 4 dp ranks, under tp 2
    "hsdp-2x2-tp2": (TINY_LLAMA, dict(tp=2, pp=1, dp=4, zero_stage=3, dp_replicate=2), {}),
    # ...and inside a pipeline (FSDP2 keeps the stage gathered and reduces once a step), under ZB-V
    "hsdp-2x2-pp2-zbv": (TINY_LLAMA, dict(tp=1, pp=2, dp=4, zero_stage=3, dp_replicate=2, schedule="zbv", vpp=2), {}),
    # ...and beside context parallelism (FSDP2 over each cp rank's (2 replicas, 2 shards); the cp replicas averaged)
    "hsdp-2x2-cp2": (TINY_LLAMA, dict(tp=1, pp=1, dp=4, cp=2, zero_stage=3, dp_replicate=2), {}),
    # op-level selective checkpointing with cp: the recompute gathers K/V again; gpt's biased linears
    # are all recomputed (addmm is not on torchtitan's list)
    "gpt-tied-cp2-tp2-selective-op": (TINY_GPT, dict(tp=2, pp=1, dp=2, cp=2, recompute="selective-op"), {}),
    # ZeRO-1 over 8 dp ranks: the even split cuts a block's gate projection by rows (data_parallel.partition_rows);
    # its step-2 checkpoint (split states assembled whole) resumes as SPLIT_RESUME and SPLIT_RESHARD
    "zero1-dp8-split": (TINY_LLAMA, dict(tp=1, pp=1, dp=8, zero_stage=1), {}),
    # the data-parallel reduction after the backward instead of during it (data_parallel.GradReduction), and ZeRO's
    # gather of the stepped parameters after the step instead of beside the next forward (ShardedAdamW.wait_for):
    # the same buckets and broadcasts, so the same values to the bit (test_runtime_multirank's overlap test): ZeRO-0
    # under SGD with the pipeline's unscaled gradients, interleaved chunks, and ZeRO-2 with main_grad, SP and the
    # tied embedding
    "sgd-after-backward": (TINY_LLAMA, dict(), {"optimizer": "sgd", "overlap_grad_reduce": False}),
    "interleaved-1f1b-after-backward": (TINY_LLAMA, dict(schedule="interleaved-1f1b", vpp=2),
                                        {"overlap_grad_reduce": False}),
    "gpt-tied-master-weights-zero2-sp-after-backward": (TINY_GPT, dict(zero_stage=2, sp=True, precision="master-weights"),
                                                        {"overlap_grad_reduce": False, "overlap_param_gather": False}),
    # and under ZB-V, whose queued weight pass tells the reduction when a linear's gradient is final (its weight-pass
    # hooks; the fused GEMM's reference arithmetic adds into main_grad there): ZeRO-2's pieces reduced to their owners
    # during the last weight passes, SP's partial gradients late, against the same run reducing after the backward;
    # 4 KiB buckets, so that the tiny model's gradients span many started at different points of the schedule (one
    # 25 MiB bucket would start at the last hook)
    "gpt-tied-master-weights-fused-zero2-sp-zbv": (TINY_GPT, dict(schedule="zbv", vpp=2, zero_stage=2, sp=True,
                                                                  precision="master-weights"),
                                                   {"wgrad_fusion": "reference", "grad_bucket_bytes": 4096}),
    "gpt-tied-master-weights-fused-zero2-sp-zbv-after-backward": (
        TINY_GPT, dict(schedule="zbv", vpp=2, zero_stage=2, sp=True, precision="master-weights"),
        {"wgrad_fusion": "reference", "grad_bucket_bytes": 4096, "overlap_grad_reduce": False,
         "overlap_param_gather": False}),
    # fp16 (parallel_layers.loss_scale): amp (fp32 math on the CPU, so the power-of-two scale is exact and the losses
    # are the fp32 tolerances' own) with ZeRO-2 and SP, whose last rank's gradients read inf at step 2: every rank
    # must skip that step (the one-rank reference skips it too), or the ranks' models part; and fp16 parameters with
    # fp32 masters, ZeRO-1, against the one-rank fp16 run at the 16-bit tolerances
    "amp-fp16-zero2-sp-overflow": (TINY_LLAMA, dict(zero_stage=2, sp=True, precision="amp", dtype="fp16"),
                                   {"debug_overflow_step": 2}),
    "gpt-tied-master-weights-fp16-zero1": (TINY_GPT, dict(zero_stage=1, precision="master-weights", dtype="fp16"), {}),
    # dropout (parallel_layers.dropout): masks keyed by sample, layer, site and position, so every layout draws the
    # one-rank run's.  The hidden dropout alone where the attention's masks are each tp and cp rank's own: replicated
    # over tp (op-level selective recompute re-draws them inside the checkpoint); then split over cp and SP, whose
    # ranks draw their own tokens' masks, in blocks of 8 tokens as the reference does, under full recompute
    "gpt-tied-dropout-hidden-selective-op": (TINY_GPT, dict(recompute="selective-op", dropout=True),
                                             DROPOUT_HIDDEN_ONLY),
    "gpt-tied-dropout-hidden-cp2-pp2-tp2-sp-full": (TINY_GPT, dict(tp=2, pp=2, dp=1, cp=2, sp=True, recompute="full",
                                                                   schedule="1f1b", dropout=True), DROPOUT_HIDDEN_ONLY),
    # the hash masks a compiling run takes (eager here: the same bits), with no blocks of tokens set: every split of
    # the sequence hashes the one-rank run's masks at its own positions
    "gpt-tied-dropout-hash-cp2-pp2-tp2-sp-full": (TINY_GPT, dict(tp=2, pp=2, dp=1, cp=2, sp=True, recompute="full",
                                                                 schedule="1f1b", dropout=True), DROPOUT_HASH),
    # and with the attention's dropout too at tp 1: interleaved chunks under selective recompute (the attention core
    # re-run in the backward), ZB-V's weight pass under full recompute
    "llama-dropout-pp2-dp4-interleaved-selective": (TINY_LLAMA, dict(tp=1, pp=2, dp=4, schedule="interleaved-1f1b", vpp=2,
                                                                      recompute="selective", dropout=True), {}),
    "llama-dropout-pp2-dp4-zbv-full": (TINY_LLAMA, dict(tp=1, pp=2, dp=4, schedule="zbv", vpp=2, recompute="full",
                                                        dropout=True), {}),
}
AFTER_BACKWARD = "-after-backward"
# the cp2-tp2-dp2 run's step-2 checkpoint resumed with another cp (and dp, ZeRO stage) for step 3
CP_RESUME_FROM = "cp2-tp2-dp2"
CP_RESUME_LAYOUT = dict(tp=2, pp=1, dp=1, cp=4, zero_stage=2)
SPLIT_FROM = "zero1-dp8-split"
SPLIT_RESUME = dict(tp=1, pp=1, dp=8, zero_stage=2)  # the same rows split, loaded into ZeRO-2
SPLIT_RESHARD = dict(tp=1, pp=1, dp=4, zero_stage=2)  # other cuts (a norm split), 4 ranks
# the hybrid-sharded run's step-2 checkpoint resumed on 4 ranks with full sharding over dp 2
HSDP_FROM = "hsdp-2x2-tp2"
HSDP_RESHARD = dict(tp=2, pp=1, dp=2, zero_stage=3)
# checkpoints resumed with another tp (parallel_layers.checkpoint saves a TP shard as its piece of the logical tensor):
# each source run saves after every step, and its step-1 checkpoint resumes on 4 ranks for steps 2 and 3, so that
# step 3's loss reads the AdamW states loaded as well as the parameters.  name -> (source run, layout)
TP_RESUME = {
    # GQA llama (q and kv heads split over tp 2) from ZeRO-0 into FSDP2's shards at tp 1, in a pipeline
    "tp-resume-gqa-tp1-fsdp2": ("cp2-tp2-dp2", dict(tp=1, pp=2, dp=2, zero_stage=3)),
    # from hybrid-sharded FSDP2's DTensors at tp 2 into ZeRO-1's split states at tp 1
    "tp-resume-hsdp-tp1-zero1": ("hsdp-2x2-tp2", dict(tp=1, pp=1, dp=4, zero_stage=1)),
    # a vocabulary tp does not divide (257: 258 padded rows at tp 2, 260 at tp 4), tied, its last stage's copy of the
    # embedding in the checkpoint as well, into tp 4 with SP
    "tp-resume-odd-vocab-tp4-sp": ("gpt-tied-odd-vocab", dict(tp=4, pp=1, dp=1, sp=True)),
    # bf16 parameters with ZeRO-2's fp32 masters ("{key}/master") at tp 2, into FSDP2's fp32 shards at tp 4
    "tp-resume-master-weights-tp4-fsdp2": ("gpt-tied-master-weights-zero2-sp",
                                           dict(tp=4, pp=1, dp=1, sp=True, zero_stage=3, precision="master-weights")),
    # latent attention (up projections split by heads, each head's key part and value) and a mixture of experts with
    # a tensor-parallel shared expert, tp 2 -> 4 and ep 4 -> 2
    "tp-resume-mla-moe-tp4": ("mla-moe-tp2-dp4-sp-ep4", dict(tp=4, pp=1, dp=1, sp=True, ep=2)),
}
# DeepSeek-V3's layout in small, as tests/test_runtime_mla.py's TINY_MLA_MOE: latent attention, a leading dense block,
# then MoE blocks with a shared expert; the source of TP_RESUME's last case (no one-rank reference here)
TINY_MLA_MOE = {**TINY_LLAMA, "kv_heads": 4, "head_dim": 24, "kv_lora_rank": 32, "q_lora_rank": 48,
                "qk_rope_head_dim": 8, "v_head_dim": 16, "experts": 4, "experts_per_token": 2, "ffn_hidden": 64,
                "shared_expert_ffn": 64, "first_dense_layers": 1, "dense_ffn_hidden": 128}
TP_RESUME_SOURCES = {"mla-moe-tp2-dp4-sp-ep4": (TINY_MLA_MOE, dict(tp=2, pp=1, dp=4, sp=True, ep=4), {})}


def tp_resume_source(name: str) -> tuple:
    """(model, layout, options) of a TP_RESUME source run."""
    return TP_RESUME_SOURCES.get(name) or PARALLEL_CASES[name]


# one-rank references (dp folded into gradient accumulation): name -> (model, options)
REFERENCE_CASES = {
    "llama": (TINY_LLAMA, {}),
    "gpt": (TINY_GPT, {}),
    "gpt-untied": ({**TINY_GPT, "tied_embeddings": False}, {}),
    "llama-tied": ({**TINY_LLAMA, "tied_embeddings": True}, {}),
    "gpt-vocab257": ({**TINY_GPT, "vocab": 257}, {}),
    "llama-sgd": (TINY_LLAMA, {"optimizer": "sgd"}),
    "llama-sgd-2x": (TINY_LLAMA, {"optimizer": "sgd", "debug_grad_scale": 2.0}),
    "gpt-master-weights": (TINY_GPT, {}),
    "gpt-master-weights-half-grads": (TINY_GPT, {}),
    "llama-amp-fp16": (TINY_LLAMA, {"debug_overflow_step": 2}),
    "gpt-master-weights-fp16": (TINY_GPT, {}),
    "gpt-dropout-hidden": (TINY_GPT, DROPOUT_HIDDEN_ONLY),
    "llama-dropout": (TINY_LLAMA, {}),
    "gpt-dropout-hidden-hash": (TINY_GPT, DROPOUT_HASH),
}
REFERENCE_PRECISION = {"gpt-master-weights": "master-weights", "gpt-master-weights-half-grads": "master-weights-half-grads",
                       "llama-amp-fp16": "amp", "gpt-master-weights-fp16": "master-weights"}
REFERENCE_DTYPE = {"llama-amp-fp16": "fp16", "gpt-master-weights-fp16": "fp16"}
REFERENCE_DROPOUT = {"gpt-dropout-hidden", "llama-dropout", "gpt-dropout-hidden-hash"}
SGD_LR = 0.5
# Global gradient-norm clipping on every AdamW job: the tiny models' one-rank norms run 0.5-1.6 over the
# first steps, so 1.0 clips some steps and not others (a wrong distributed norm then changes the losses,
# which a constant clip factor would not under AdamW); the SGD jobs check a 2x gradient and do not clip
CLIP_GRAD = 1.0


def _lr(opts):
    return SGD_LR if opts.get("optimizer") == "sgd" else 1e-2


def _clip(opts):
    return None if opts.get("optimizer") == "sgd" else CLIP_GRAD


def _job(tmp: Path, name: str, plan, opts: dict, steps=STEPS) -> dict:
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    o = {"steps": steps, "device": "cpu", "dump_grads": str(d / "grads"), **opts}
    return {"plan": write_plan(plan, d / "plan.json"), "report": str(d / "report.json"), "opts": o}


def reference_jobs(tmp: Path) -> list[dict]:
    return [_job(tmp, f"ref-{n}", tiny_plan(m, lr=_lr(o), clip_grad=_clip(o), precision=REFERENCE_PRECISION.get(n, "fp32"),
                                           dtype=REFERENCE_DTYPE.get(n, "bf16"), dropout=n in REFERENCE_DROPOUT), o)
            for n, (m, o) in REFERENCE_CASES.items()]


def parallel_jobs(tmp: Path) -> list[dict]:
    jobs = [_job(tmp, n, tiny_plan(m, lr=_lr(o), clip_grad=_clip(o), **{**LAYOUT, **p}), o)
            for n, (m, p, o) in PARALLEL_CASES.items()]
    # stop after step 2 with a checkpoint, then resume to step 3 in a fresh runtime
    plan = tiny_plan(TINY_LLAMA, **LAYOUT, zero_stage=1, clip_grad=CLIP_GRAD)
    ck = str(tmp / "resume" / "ckpt")
    jobs.append(_job(tmp, "resume-first", plan, {"checkpoint_dir": ck, "checkpoint_every": 2}, steps=2))
    jobs.append(_job(tmp, "resume-second", plan, {"checkpoint_dir": ck, "resume": True}, steps=STEPS))  # writes step 3 too
    ck = str(tmp / "cp-resume" / "ckpt")
    next(j for j in jobs if j["report"] == str(tmp / CP_RESUME_FROM / "report.json"))["opts"].update(
        checkpoint_dir=ck, checkpoint_every=2)
    jobs.append(_job(tmp, "cp-resume", tiny_plan(TINY_LLAMA, **CP_RESUME_LAYOUT, clip_grad=CLIP_GRAD),
                     {"checkpoint_dir": ck, "resume": True, "resume_step": 2}, steps=STEPS))
    ck = str(tmp / "split" / "ckpt")
    next(j for j in jobs if j["report"] == str(tmp / SPLIT_FROM / "report.json"))["opts"].update(
        checkpoint_dir=ck, checkpoint_every=2)
    next(j for j in jobs if j["report"] == str(tmp / HSDP_FROM / "report.json"))["opts"].update(
        checkpoint_dir=str(tmp / "hsdp" / "ckpt"), checkpoint_every=2)
    jobs.append(_job(tmp, "split-resume", tiny_plan(TINY_LLAMA, **SPLIT_RESUME, clip_grad=CLIP_GRAD),
                     {"checkpoint_dir": ck, "resume": True, "resume_step": 2}, steps=STEPS))
    # one step more under torch.profiler (--profile), after the three the 1f1b case compares
    next(j for j in jobs if j["report"] == str(tmp / PROFILED / "report.json"))["opts"]["profile"] = \
        str(tmp / PROFILED / "profile")
    for name, (m, p, o) in TP_RESUME_SOURCES.items():
        jobs.append(_job(tmp, name, tiny_plan(m, lr=_lr(o), clip_grad=_clip(o), **{**LAYOUT, **p}), o))
    for source in {s for s, _ in TP_RESUME.values()}:  # every step saved (the cp and hsdp ones resume from step 2 too)
        job = next(j for j in jobs if j["report"] == str(tmp / source / "report.json"))
        job["opts"].update(checkpoint_dir=job["opts"].get("checkpoint_dir") or str(tmp / source / "ckpt"),
                           checkpoint_every=1)
    return jobs


def tp_resume_dir(tmp: Path, source: str) -> Path:
    """Where a TP_RESUME source run saves (parallel_jobs)."""
    return tmp / {CP_RESUME_FROM: "cp-resume", HSDP_FROM: "hsdp"}.get(source, source) / "ckpt"


def reshard_jobs(tmp: Path) -> list[dict]:
    """4-rank resumes of the 8-rank ZeRO-1 checkpoint (step 2) in other layouts with the same tp:
    fewer dp ranks (dp folded into micro-batches), and pp 2 -> 1 with FSDP2; then of the split, hybrid-sharded and
    TP_RESUME runs' checkpoints (the last with another tp)."""
    ck = str(tmp / "resume" / "ckpt")
    return [_job(tmp, name, tiny_plan(TINY_LLAMA, **par, clip_grad=CLIP_GRAD), {"checkpoint_dir": ck, "resume": True,
                                                                          "resume_step": 2}, steps=STEPS)
            for name, par in (("reshard-dp1-zero0", dict(tp=2, pp=2, dp=1)),
                              ("reshard-pp1-fsdp2", dict(tp=2, pp=1, dp=2, zero_stage=3)))] + [
        _job(tmp, "split-reshard", tiny_plan(TINY_LLAMA, **SPLIT_RESHARD, clip_grad=CLIP_GRAD),
             {"checkpoint_dir": str(tmp / "split" / "ckpt"), "resume": True, "resume_step": 2}, steps=STEPS),
        _job(tmp, "hsdp-reshard", tiny_plan(TINY_LLAMA, **HSDP_RESHARD, clip_grad=CLIP_GRAD),
             {"checkpoint_dir": str(tmp / "hsdp" / "ckpt"), "resume": True, "resume_step": 2}, steps=STEPS)] + [
        _tp_resume_job(tmp, name) for name in TP_RESUME]


def _tp_resume_job(tmp: Path, name: str) -> dict:
    """A TP_RESUME case: its source's model and options in another layout, from the source's step-1 checkpoint."""
    source, layout = TP_RESUME[name]
    model, _, opts = tp_resume_source(source)
    return _job(tmp, name, tiny_plan(model, lr=_lr(opts), clip_grad=_clip(opts), **layout),
                {**opts, "checkpoint_dir": str(tp_resume_dir(tmp, source)), "resume": True, "resume_step": 1},
                steps=STEPS)


def run_phases(tmp: Path, phases) -> Path:
    """run_jobs for each (name, jobs, nproc) in order, failing with the torchrun's output tail if one fails; tmp."""
    for name, jobs, nproc in phases:
        r = run_jobs(jobs, nproc, tmp, name)
        assert r.returncode == 0, f"{name} torchrun failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return tmp


def run_against_one_rank(tmp: Path, references: dict, cases: dict, nproc: int = 4) -> Path:
    """Each reference model (name -> ModelSpec fields) on one rank as ref-NAME and each case (name -> (reference,
    layout)) on nproc ranks, tiny plans clipped at CLIP_GRAD: the model-option suites (test_runtime_post_norms,
    test_runtime_qk_norms); tmp."""
    def plan(model: dict, **layout):  # (a reference's "training": Training fields of its plan, as packed documents)
        model = dict(model)
        return tiny_plan(model, clip_grad=CLIP_GRAD, **model.pop("training", {}), **layout)
    ref = [_job(tmp, f"ref-{n}", plan(m), {}) for n, m in references.items()]
    par = [_job(tmp, n, plan(references[r], **layout), {}) for n, (r, layout) in cases.items()]
    return run_phases(tmp, (("ref", ref, 1), ("par", par, nproc)))


def check_against_one_rank(runs: Path, case: str, reference: str, layout: dict, names: tuple[str, ...],
                           loss_rtol: float, grad_rtol: float) -> None:
    """A run_against_one_rank case's losses against its reference's (loss_rtol), and its step-1 reduced gradients
    (grad_rtol, relative to each gradient's max; ZeRO-2's from their owners), among them parameters named with each of
    `names` (replicated ones equal on every tp rank)."""
    from tests.runtime_helpers.compare import assemble, load_dumps, max_relative_error
    ref, got = losses(runs, f"ref-{reference}"), losses(runs, case)
    assert len(got) == STEPS and all(abs(g - r) <= loss_rtol * abs(r) for g, r in zip(got, ref)), (case, got, ref)
    grads_ref = assemble(load_dumps(runs / f"ref-{reference}" / "grads"))
    grads = assemble(load_dumps(runs / case / "grads"), None if layout.get("zero_stage") == 2 else 0)
    assert all(any(n in g for g in grads_ref) for n in names), names
    err, name = max_relative_error(grads, grads_ref)
    assert err <= grad_rtol, f"{case}: {name} off by {err:.2e}"


def report(tmp: Path, name: str) -> dict:
    """A job's report.json (written under tmp/name by _job)."""
    return json.loads((tmp / name / "report.json").read_text())


def losses(tmp: Path, name: str) -> list[float]:
    return [s["loss"] for s in report(tmp, name)["steps"]]


def run_jobs(jobs: list[dict], nproc: int, tmp: Path, name: str, timeout=600) -> subprocess.CompletedProcess:
    path = tmp / f"{name}.jobs.json"
    path.write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "tests.runtime_helpers.multi_run", str(path)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    import time
    tmp = Path(sys.argv[1])
    for nm, jobs, n in (("ref", reference_jobs(tmp), 1), ("par", parallel_jobs(tmp), 8), ("reshard", reshard_jobs(tmp), 4)):
        t = time.time()
        r = run_jobs(jobs, n, tmp, nm)
        print(nm, r.returncode, f"{time.time() - t:.1f}s")
        print("\n".join(l for l in (r.stdout + r.stderr).splitlines() if "[parplan]" in l or "Error" in l)[-6000:])
