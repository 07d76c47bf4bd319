"""Predicted against published: every reference set under benchmarks/reference/.

Each set has an adapter that turns a published row into a planner query: the model shape, the
GPU count, every setting the publication states pinned, and for settings it does not state a
search restricted to what that framework version offered (e.g. Megatron-LM 2024 had no
zero-bubble schedule and no offload).  The metric compared is the one the publication reports
(hardware TFLOP/s per GPU, MFU, ...), computed with the publication's FLOP convention.

    from planner.validate import validate_all
    for case in validate_all(): print(case.set_name, case.label, case.published, case.predicted)
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from pydantic import ValidationError

from cost_models.layout import ModelDims

from .schema import ModelSpec, validation_summary
from .search import Pins


@dataclass
class Query:
    label: str
    spec: ModelSpec
    gpus: int
    hardware: str
    seq_len: int
    global_batch_size: int
    metric: str  # a Prediction attribute, or a callable name in METRICS
    published: float
    dtype: str = "bf16"
    precision: str = "master-weights"
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool | None = None  # as overlap_grad_reduce (Megatron's --overlap-param-gather beside it)
    overlap_tp_comm: bool = False
    inter_node_gbytes_per_s: float | None = None
    gpus_per_node: int | None = None
    dropout: bool = False
    fp8: bool = False  # FP8 linears (Training.fp8): only the NeMo FP8 set
    zero1_grad_reduce: str = "reduce-scatter"  # Megatron's distributed optimizer unless a set says otherwise
    zero2_grad_reduce: str = "per-step"  # only the Llama 3 set uses ZeRO-2 (FSDP), and says otherwise
    grad_accumulation_fusion: bool = True  # Megatron-LM's default unless a set says otherwise
    p2p_scatter_gather: bool = True  # Megatron-LM's default unless a set says otherwise
    fused_cross_entropy: bool = True  # Megatron's vocab-parallel cross-entropy (every published stack here uses it)
    cross_entropy_16bit_grad: bool = False  # flash-attn's cross-entropy (llm-foundry) keeps its gradient in 16 bits
    fused_elementwise: bool = True  # fused pointwise kernels (Megatron, DeepSpeed's Megatron fork, torch.compile)
    overlap_cp_comm: bool = True  # ring attention (Megatron); only the Llama 3 set has CP, and says otherwise
    # Megatron-LM's asynchronous input-gradient all-reduce beside the weight-gradient GEMM: on by default since
    # 2022, so only the Megatron sets of 2022 on (Korthikanti, Megatron-Core H100) turn it on; the 2021 sets, the
    # Megatron-DeepSpeed ones (off by default there) and those that do not say keep it off
    async_tp_grad_comm: bool = False
    # the profile's measured attention curve (the kernels every stack here ran are FlashAttention-2 or newer),
    # except llm-foundry's 2023 MPT runs: the Triton FlashAttention of 2022
    attention_kernel: str = "profile"
    moe_dispatcher: str = "alltoall"  # a mixture of experts' dispatcher (megatron_moe_h100 says per row)
    moe_recompute: str = "none"  # and its recompute modules
    mla_recompute: bool = False  # multi-head latent attention's up projections recomputed (mla_up_proj)
    moe_a2a_overlap: bool = False  # Megatron-Core's combined 1F1B (megatron_moe_h100's '+1f1b overlap' row says so)
    # the stack flags above are all explicit; the framework still decides what is not a flag: ZeRO-3's
    # memory (FSDP2 vs DeepSpeed stage 3) and torch.distributed.pipelining's per-micro-batch buffers
    framework: str = "megatron"
    pin_variants: list[Pins] = field(default_factory=lambda: [Pins()])


@dataclass
class Case:
    set_name: str
    label: str
    metric: str
    published: float
    predicted: float | None
    plan: object | None
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return (self.predicted - self.published) / self.published


def reference_dir() -> Path:
    """$PARPLAN_REFERENCE_DIR, else the checkout's benchmarks/reference, else the copy installed with
    the package (`parplan_reference`, the same files, shipped in the wheel)."""
    env = os.environ.get("PARPLAN_REFERENCE_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parent.parent / "benchmarks" / "reference"
    if checkout.is_dir():
        return checkout
    from importlib.util import find_spec
    spec = find_spec("parplan_reference")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return checkout


def _gpt(r: dict, vocab: int, tied: bool, ffn=None) -> ModelSpec:
    return ModelSpec(name=r.get("model") or f"gpt-{r['layers']}x{r['hidden']}", arch="gpt", layers=r["layers"],
                     hidden=r["hidden"], heads=r["heads"], kv_heads=r.get("kv_heads") or r["heads"],
                     ffn_hidden=ffn or r.get("ffn_hidden") or 4 * r["hidden"], vocab=vocab, tied_embeddings=tied)


# Megatron-LM's fp16 runs keep 16-bit gradient buffers and all-reduce them in 16 bits unless
# --accumulate-allreduce-grads-in-fp32 is given (only bf16 forces it: megatron/arguments.py), and before 2022
# its DDP hook added each micro-batch's gradient into that buffer (param.main_grad.add_(param.grad)): no
# gradient accumulation fusion.  So the 2021 fp16 sets use the 16-bit-gradient recipe, unfused.
MEGATRON_2021_FP16 = "master-weights-half-grads"


def megatron_sc21_table1(d: dict) -> Iterable[Query]:
    """Narayanan 2021 Table 1: every setting is stated (tp, pp, dp, mbs, vpp from the authors'
    script, full recompute, fp16, no SP, no ZeRO); Megatron 2021 all-reduced gradients after the
    backward (no overlap), waited for the tensor-parallel input-gradient all-reduce (the asynchronous
    one came later: async_tp_grad_comm off) and used unfused softmax attention.  Metric: hardware TFLOP/s per GPU
    (eq. 3: includes the recompute forward)."""
    c = d["common"]
    for r in d["rows"]:
        lpv = r.get("layers_per_virtual_stage")
        vpp = r["layers"] // (r["pp"] * lpv) if lpv else 1
        pins = Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, mbs=r["micro_batch_size"], vpp=vpp, zero=0,
                    recompute="full", sp=False, schedule="interleaved-1f1b" if vpp > 1 else "1f1b", offload="none")
        yield Query(label=f"{r['params_billion']}B", spec=_gpt(r, c["vocab"], True), gpus=r["gpus"],
                    hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="hardware_tflops_per_gpu", published=r["tflops_per_gpu"], dtype="fp16",
                    precision=MEGATRON_2021_FP16, grad_accumulation_fusion=False,
                    flash_attention=False, overlap_grad_reduce=False, dropout=True, pin_variants=[pins])


def megatron_h100_2024(d: dict) -> Iterable[Query]:
    """Megatron-Core r0.8 H100 weak scaling: tp, pp, dp and the overlap flags are stated; micro-batch,
    virtual stages and recompute are not, so they are searched within what Megatron-Core r0.8
    offers: 1F1B or interleaved 1F1B, distributed optimizer (ZeRO-1) or none, no offload,
    sequence parallelism with TP (required by --tp-comm-overlap).  Metric: MFU."""
    c = d["common"]
    for r in d["rows"]:
        scheds = ["1f1b", "interleaved-1f1b"] if r["pp"] > 1 else ["1f1b"]
        variants = [Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, schedule=s, zero=z, offload="none",
                         sp=r["tp"] > 1) for s in scheds for z in (0, 1)]
        yield Query(label=r["model"], spec=_gpt(r, c["vocab"], not c.get("untied_embeddings", False)),
                    gpus=r["gpus"], hardware="h100-sxm-80gb", seq_len=c["seq_len"],
                    global_batch_size=r["global_batch_size"], metric="mfu", published=r["mfu_percent"] / 100,
                    overlap_grad_reduce=True, overlap_tp_comm=True, async_tp_grad_comm=True, dropout=True,
                    pin_variants=variants)


# ---------------------------------------------------------------- metric conversions
# A Query.metric is a Prediction attribute or a name in METRICS: fn(plan, query) -> float.  The
# planner's own conventions: model FLOPs per token = 6 x matmul params (output projection
# included) + 12 L (heads*head_dim) s (no recompute, no causal discount) -- this is exactly
# Korthikanti 2022 eq. 7 for GPT shapes; hardware FLOPs add the recompute forward (full: 2 x
# block matmul params + 4 L h s per token, which makes SC21 eq. 3 exactly; selective: 4 L h s).

def _attn_width(spec: ModelSpec) -> int:
    return spec.attention_width


def _model_flops_per_token(plan) -> float:
    """Model FLOPs per token as the cost model counted them (recovered from the prediction)."""
    p = plan.prediction
    return p.model_tflops_per_gpu * 1e12 * plan.hardware.gpus / p.tokens_per_s


def mfu_causal(plan, q: "Query") -> float:
    """MFU with the attention score/value FLOPs counted over the causal mask's pairs: 12 L h s -> 6 L h s without a
    window; a windowed layer's MFU term (12 h min(s, w), ModelDims.attention_span) becomes its band's pairs per
    query, (s w - w^2 / 2) / s (ModelDims.causal_pairs_fraction)."""
    mf = _model_flops_per_token(plan)
    dims = ModelDims.from_spec(plan.model, plan.training.seq_len)
    per_pair = 12 * plan.model.layers * _attn_width(plan.model)
    counted = per_pair * dims.attention_span()
    causal = per_pair * plan.training.seq_len / 2 * dims.causal_pairs_fraction()
    return plan.prediction.mfu * (mf - counted + causal) / mf


def sc21_eq3_tflops(plan, q: "Query") -> float:
    """Narayanan 2021 eq. 3 per GPU: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration over the
    predicted step time, whatever recompute the plan chose (the paper applies the formula to the
    ZeRO-3 baseline too, where recompute is not stated)."""
    m, s = plan.model, plan.training.seq_len
    l, h, V = m.layers, m.hidden, m.vocab
    per_seq = 96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    seqs_per_s = plan.prediction.tokens_per_s / s
    return seqs_per_s * per_seq / plan.hardware.gpus / 1e12


def neox_tflops(plan, q: "Query") -> float:
    """GPT-NeoX's logged FLOP/s per GPU (megatron/logging.py get_flops of the 2022 code):
    B s (6 x total params + 60 s h L) per iteration over the step time -- no recompute term, embeddings
    counted in the 6N, an attention term of 60 s h L per token (5x the planner's 12 L h s)."""
    m, s = plan.model, plan.training.seq_len
    per_token = 6 * m.num_params + 60 * s * m.hidden * m.layers
    return plan.prediction.tokens_per_s * per_token / plan.hardware.gpus / 1e12


def tokens_per_s_per_gpu(plan, q: "Query") -> float:
    return plan.prediction.tokens_per_s / plan.hardware.gpus


def memory_gib(plan, q: "Query") -> float:
    """The predicted peak per GPU in GiB (the allocator's view: no CUDA context or NCCL buffers; a run's
    reserved peak adds the caching allocator's slack to it)."""
    return plan.prediction.memory_bytes_per_gpu.total / 2**30


METRICS: dict[str, Callable] = {"mfu_causal": mfu_causal, "sc21_eq3_tflops": sc21_eq3_tflops,
                                "neox_tflops": neox_tflops, "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
                                "memory_gib": memory_gib}


def metric_value(plan, q: "Query") -> float:
    if q.metric in METRICS:
        return float(METRICS[q.metric](plan, q))
    return float(getattr(plan.prediction, q.metric))


# ---------------------------------------------------------------- adapters for the held-out sets
MEGATRON_2021_SCHEDULES = ("1f1b", "interleaved-1f1b")


def korthikanti2022_selective_recompute(d: dict) -> Iterable[Query]:
    """Korthikanti 2022 Tables 3 and 5 (+ the 2240-GPU scale-out of Sec. 6.3 / abstract).  Stated and
    pinned: tp, pp, dp, micro-batch, recompute (selective or full), sequence parallelism (with
    selective only), ZeRO 0, no offload, virtual stages 3 for 175B/530B (interleaved 1F1B) and plain
    1F1B otherwise.  Megatron 2022 had no overlap of the gradient all-reduce (the paper says so for
    the 2240-GPU run; the Table 5 runs have dp=1) and no fused (flash) attention; it did start the
    column-parallel layers' input-gradient all-reduce (reduce-scatter with SP) asynchronously beside
    their weight-gradient GEMMs (async_tensor_model_parallel_allreduce, on by default; async_tp_grad_comm).  16-bit dtype is not
    named: bf16 (fp16 has the same A100 peak).  The 2240-GPU full-recompute baseline has no published
    vpp: 1F1B and interleaved 1F1B are searched.
    Metric: MFU, the paper's eq. 7, 72 B L s h^2 (1 + s/(6h) + V/(12hL)) per iteration.  Per token this
    is 72 L h^2 + 12 L h s + 6 V h = 6 x (L x 12h^2 + V h) + 12 L h s, which is the planner's model
    FLOPs for a GPT shape (checked by hand), so `mfu` is compared directly.  HFU is not used: eq. 8
    adds 12 L h s per token for selective recompute where the replayed attention core forward is
    4 L h s, so the paper's HFU is not a convention the planner reproduces."""
    c = d["common"]
    for r in d["rows"]:
        if r.get("mfu_percent") is None:
            continue
        v = r.get("virtual_stages_per_pipeline_rank")
        base = dict(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, mbs=r["micro_batch_size"], zero=0,
                    recompute=r["recompute"], sp=bool(r["sequence_parallel"]), offload="none")
        if v:
            variants = [Pins(**base, vpp=v, schedule="interleaved-1f1b")]
        elif r.get("iteration_time_s") is None and r["pp"] > 1:  # vpp of the baseline not published
            variants = [Pins(**base, schedule=s) for s in MEGATRON_2021_SCHEDULES]
        else:
            variants = [Pins(**base, vpp=1, schedule="1f1b")]
        label = f"{r['model'].split()[0]} {r['gpus']}gpu {r['recompute']}"
        yield Query(label=label, spec=_gpt(r, c["vocab"], c.get("tied_embeddings", True)), gpus=r["gpus"],
                    hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="mfu", published=r["mfu_percent"] / 100, flash_attention=False,
                    overlap_grad_reduce=False, async_tp_grad_comm=True, dropout=True, gpus_per_node=c.get("gpus_per_node"),
                    inter_node_gbytes_per_s=c.get("inter_node_gb_s_per_gpu_per_direction"), pin_variants=variants)


def megatron_sc21_table2_zero3(d: dict) -> Iterable[Query]:
    """Narayanan 2021 Table 2 (PTD-P vs ZeRO-3).  ZeRO-3 rows (DeepSpeed inside Megatron): dp = gpus,
    tp = pp = 1, ZeRO 3, micro-batch as printed, no offload; recompute is not stated, so none or full
    (DeepSpeed 2021 had no selective recompute); DeepSpeed overlaps the gradient reduce-scatter with the
    backward (overlap_comm).  PTD-P rows: micro-batch 1, full recompute, no ZeRO, no SP, no overlap of
    the gradient all-reduce (as in Table 1); the 530B rows are tp 8 x pp 35 (Table 1's model); the
    174.6B rows state only model-parallel size 96, so tp x pp = 96 is searched with tp <= 8 (one
    node); interleaving is not stated, so 1F1B and interleaved 1F1B are searched.  fp16, unfused
    attention.  Metric: eq. 3 hardware TFLOP/s per GPU (`sc21_eq3_tflops`, the paper's formula over the
    predicted time, so it counts the recompute forward even where a ZeRO-3 plan chose none)."""
    c = d["common"]
    for r in d["rows"]:
        if r["scheme"] == "zero3":
            variants = [Pins(tp=1, pp=1, dp=r["gpus"], cp=1, mbs=r["micro_batch_size"], zero=3, recompute=rc,
                             sp=False, vpp=1, schedule="1f1b", offload="none") for rc in ("full", "none")]
            overlap = True
            precision = "master-weights-half-grads"  # DeepSpeed fp16: 16-bit params and grads (ZeRO paper, K=12)
        else:
            mp = r["model_parallel_size"]
            splits = [(r["tp"], r["pp"])] if r.get("tp") and r.get("pp") else \
                [(t, mp // t) for t in (1, 2, 4, 8) if mp % t == 0 and r["heads"] % t == 0 and mp // t <= r["layers"]]
            variants = [Pins(tp=t, pp=p, dp=r["gpus"] // mp, cp=1, mbs=r["micro_batch_size"], zero=0,
                             recompute="full", sp=False, schedule=s, offload="none")
                        for t, p in splits for s in MEGATRON_2021_SCHEDULES]
            overlap = False
            precision = MEGATRON_2021_FP16
        yield Query(label=f"{r['scheme']} {r['params_billion']}B {r['gpus']}gpu",
                    spec=_gpt(r, c["vocab"], c.get("tied_embeddings", True)), gpus=r["gpus"],
                    hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="sc21_eq3_tflops", published=r["tflops_per_gpu"], dtype="fp16", flash_attention=False,
                    overlap_grad_reduce=overlap, precision=precision, dropout=True, gpus_per_node=c.get("gpus_per_node"),
                    grad_accumulation_fusion=False,  # DeepSpeed, and Megatron of 2021, accumulate in a separate pass
                    inter_node_gbytes_per_s=c.get("inter_node_gb_s_per_gpu_per_direction"), pin_variants=variants,
                    framework="deepspeed" if r["scheme"] == "zero3" else "megatron")


def llama3_405b_table4(d: dict) -> Iterable[Query]:
    """Llama 3 405B Table 4.  Pinned: tp, cp, pp, dp, ZeRO 2 (the file's reading of FSDP sharding
    optimizer states and gradients), no offload, no recompute for the two 8K stages (paper).  Searched:
    micro-batch, SP, schedule/V (interleaved 1F1B or 1F1B; 126 layers do not divide pp*vpp, so the
    virtual stages are uneven: the first and last are lighter, as Meta describes), and recompute
    for the 128K stage (not stated).  Fused attention assumed (kernel not stated; 128K needs it).
    Untied embeddings (not stated in the paper; the released checkpoint is untied).  Network: 400 Gb/s
    per GPU = the h100-sxm-80gb profile's 50 GB/s.  TP-comm overlap not stated: off.  Gradient accumulation
    not stated: fused (no separate pass), like the other unstated choices given the faster option.
    Context parallelism: all-gather based, and "the all-gather communication latency is exposed in the
    critical path" (sec. 3.3.2): overlap_cp_comm off.
    Gradients: the file reads FSDP as sharding them, so they are reduce-scattered as each micro-batch's
    backward produces them (zero2_grad_reduce per-micro-batch; reducing once per step would need the
    full gradients on every rank).
    Metric: Table 4 MFU.  The paper defines MFU after Chowdhery et al. 2022, whose App. B formula
    (6N + 12 L H Q T per token) has no causal discount, so the planner's `mfu` (same convention) is
    compared; the note on each case gives the causally discounted value too."""
    c = d["common"]
    spec = ModelSpec(name="llama3-405b", arch="llama", layers=c["layers"], hidden=c["hidden"], heads=c["heads"],
                     kv_heads=c["kv_heads"], ffn_hidden=c["ffn_hidden"], vocab=c["vocab"], tied_embeddings=False)
    for r in d["rows"]:
        recs = [r["recompute"]] if r.get("recompute") else ["none", "selective", "full"]
        variants = [Pins(tp=r["tp"], cp=r["cp"], pp=r["pp"], dp=r["dp"], zero=2, offload="none", recompute=rc,
                         schedule=s) for rc in recs for s in MEGATRON_2021_SCHEDULES]
        yield Query(label=f"{r['gpus']}gpu seq{r['seq_len']} cp{r['cp']}", spec=spec, gpus=r["gpus"],
                    hardware="h100-sxm-80gb", seq_len=r["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="mfu", published=r["mfu_percent"] / 100, flash_attention=True,
                    overlap_grad_reduce=True, overlap_tp_comm=False, overlap_cp_comm=False,
                    gpus_per_node=c.get("gpus_per_node"),
                    zero2_grad_reduce="per-micro-batch",
                    inter_node_gbytes_per_s=c.get("inter_node_gb_s_per_gpu_per_direction"), pin_variants=variants)


def bloom_176b(d: dict) -> Iterable[Query]:
    """BLOOM-176B on Jean Zay.  Every layout setting is stated and pinned: tp 4, pp 12, dp 8,
    micro-batch, full recompute, ZeRO-1 (BF16Optimizer), no SP, non-interleaved DeepSpeed pipeline
    (1F1B), unfused attention, bf16, tied embeddings, vocab 250880.  ALiBi is modelled as the gpt
    arch (the learned position table it lacks is 2048 x 14336 = 0.03B params, negligible).  Network:
    4 x 100 Gb/s Omni-Path per 8 GPUs = 6.25 GB/s per GPU per direction (as the file states).
    DeepSpeed's pipeline engine reduces gradients after the last micro-batch: no overlap; with the BF16
    optimizer and DeepSpeed zero stage 0 the engine all-reduces the fp32 gradients
    (`buffered_allreduce_fallback` on `get_grads_for_reduction()`, deepspeed/runtime/engine.py) and the
    optimizer all-gathers the bf16 parameters after stepping its shard; after each micro-batch's backward
    the BF16 optimizer adds the bf16 gradients into its fp32 buffers (no gradient accumulation fusion); the
    engine runs each pipeline send and receive as its own blocking transfer of 1/tp of the tensor (its
    partitioned buffers, all-gathered by the receiver; framework deepspeed).  70 layers
    on 12 stages are uneven (the planner spreads them; BLOOM put 5/6 blocks + embeddings).
    Metric: the logged TFLOPs, Megatron-DeepSpeed's formula with checkpoint factor 4:
    96 B s L h^2 (1 + s/(6h) + V/(16 L h)) = SC21 eq. 3 = the planner's hardware FLOPs with full
    recompute, so `hardware_tflops_per_gpu` is compared directly."""
    c = d["common"]
    for r in d["rows"]:
        pins = Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, mbs=r["micro_batch_size"], vpp=1, zero=1,
                    recompute="full", sp=False, schedule="1f1b", offload="none")
        yield Query(label=f"gbs{r['global_batch_size']} mbs{r['micro_batch_size']}",
                    spec=_gpt(r, c["vocab"], True, ffn=4 * r["hidden"]), gpus=r["gpus"], hardware="a100-sxm-80gb",
                    seq_len=c["seq_len"], global_batch_size=r["global_batch_size"], metric="hardware_tflops_per_gpu",
                    published=r["tflops_per_gpu"], dtype="bf16", flash_attention=False, overlap_grad_reduce=False,
                    gpus_per_node=c["gpus_per_node"], inter_node_gbytes_per_s=c["inter_node_gb_s_per_gpu_per_direction"],
                    zero1_grad_reduce="all-reduce", grad_accumulation_fusion=False, pin_variants=[pins],
                    framework="deepspeed")


OPT_VOCAB = 50272  # GPT-2 BPE as padded in the released OPT configs; 0.3% of the FLOPs either way


def opt_175b(d: dict) -> Iterable[Query]:
    """OPT-175B, a plausibility anchor only (the file says so): 992 A100 80GB, "up to" 147 TFLOP/s, FLOP
    convention unknown.  Metaseq = FSDP (ZeRO-3) + Megatron TP, no pipeline (framework fsdp): pp 1, ZeRO 3, tp searched
    over 1/2/4/8 (within a node), micro-batch searched, recompute none or full (no selective in 2021/22
    metaseq), no SP, no offload.  Global batch: "2M tokens" = 992 sequences of 2048 (2.03M tokens), the
    only count near 2M divisible by every dp that 992 GPUs allow -- derived, not published.  Vocab is
    not in the file: GPT-2 BPE padded (OPT_VOCAB); network unknown: profile default.  fp16.
    Metric: hardware TFLOP/s per GPU (the convention is unknown; the published figure is a peak, so a
    prediction below it is expected)."""
    c = d["common"]
    for r in d["rows"]:
        gbs = 992
        variants = [Pins(tp=t, pp=1, cp=1, zero=3, recompute=rc, sp=False, vpp=1, schedule="1f1b", offload="none")
                    for t in (1, 2, 4, 8) for rc in ("none", "full")]
        yield Query(label=f"{r['model']} {r['gpus']}gpu (peak)", spec=_gpt(r, OPT_VOCAB, True, ffn=4 * r["hidden"]),
                    gpus=r["gpus"], hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=gbs,
                    metric="hardware_tflops_per_gpu", published=r["tflops_per_gpu"], dtype="fp16",
                    flash_attention=False, overlap_grad_reduce=True, dropout=True, grad_accumulation_fusion=False,
                    pin_variants=variants, framework="fsdp")  # FSDP (fp32 shards as masters) + TP without SP


def gpt_neox_20b(d: dict) -> Iterable[Query]:
    """GPT-NeoX-20B on 96 A100 40GB (configs/20B.yml): tp 2, pp 4, dp 12, micro-batch 4, global batch
    1536, full recompute, ZeRO-1, fp16, unfused attention, untied embeddings, vocab 50432, ffn 24576,
    DeepSpeed non-interleaved pipeline (1F1B), no SP, no offload -- all pinned.  Parallel attention+MLP
    is modelled as the sequential gpt block (same FLOPs), with rotary positions (no table).  Network: 4 ConnectX-6 HCAs per 8 GPUs, speed
    not stated; 200 Gb/s is ConnectX-6's top rate, so 4 x 200 Gb/s / 8 = 12.5 GB/s per GPU is an upper
    bound (the profile's 25 GB/s assumes one HCA per GPU).  DeepSpeed's pipeline engine reduces
    gradients after the last micro-batch: no overlap; it runs each send and receive as its own blocking
    transfer of 1/tp of the tensor (partitioned buffers; framework deepspeed).
    Metric: 117 TFLOP/s per GPU (unverified, secondary source), convention not stated; compared with
    `neox_tflops`, the formula GPT-NeoX's own logger used in 2022 (6 x total params + 60 s h L per
    token; which code version produced the 117 is not confirmed).  For this shape it is 0.92x the
    eq.-3 hardware FLOPs and 1.22x the model FLOPs."""
    c = d["common"]
    for r in d["rows"]:
        pins = Pins(tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=1, mbs=r["micro_batch_size"], vpp=1, zero=1,
                    recompute="full", sp=False, schedule="1f1b", offload="none")
        spec = _gpt(r, c["vocab"], False, ffn=c["ffn_hidden"]).model_copy(update={"learned_positions": False})  # rotary
        yield Query(label=r["model"], spec=spec, gpus=r["gpus"],
                    hardware="a100-sxm-40gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="neox_tflops", published=r["tflops_per_gpu"], dtype="fp16",
                    precision="master-weights-half-grads", flash_attention=False, overlap_grad_reduce=False, gpus_per_node=c["gpus_per_node"],
                    inter_node_gbytes_per_s=12.5, grad_accumulation_fusion=False, pin_variants=[pins],
                    framework="deepspeed")


def pipeline_slot_fits(d: dict) -> dict[int, tuple[float, float]]:
    """The micro-batch of a set whose rows differ only in dp at one global batch under a 1F1B pipeline
    (MT-NLG's three): for each micro-batch b dividing every row's per-replica batch, the least-squares line
    t = a (m + pp - 1) + c through the published iteration times, m = global batch / (dp b) micro-batches and
    m + pp - 1 the schedule's slots (Narayanan 2021: the bubble is pp - 1 of them).  a is a slot's time and
    c the time outside the pipeline (gradient reduction, optimizer step): {b: (a, c)}.  Nothing of the
    cost model enters: the published times alone."""
    c, rows = d["common"], d["rows"]
    per_replica = [r["global_batch_size"] // r["dp"] for r in rows]
    t = np.array([r["iteration_time_s"] for r in rows], dtype=float)
    fits = {}
    for b in range(1, min(per_replica) + 1):
        if any(n % b for n in per_replica):
            continue
        x = np.array([n // b + c["pp"] - 1 for n in per_replica], dtype=float)
        (a, c0), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], axis=1), t, rcond=None)
        fits[b] = (float(a), float(c0))
    return fits


def mt_nlg_530b(d: dict) -> Iterable[Query]:
    """MT-NLG 530B (Smith et al. 2022 Sec. 2.4) on Selene, batch 1920 at 280/350/420 DGX A100 nodes.
    Pinned: tp 8 x pp 35 (dp = gpus / 280), non-interleaved DeepSpeed pipeline (1F1B, vpp 1), no SP,
    no offload, unfused attention, tied embeddings, and the micro-batch the file gives: not published, it is
    identified from the published iteration times (`pipeline_slot_fits`: at 2 they are slots x a with
    nothing left outside the pipeline; at 1 they would need 6.0 s an iteration no mechanism explains, at 4
    or more a negative time; the file's note).  Not published, so searched: recompute (none or full;
    DeepSpeed 2021 had no selective) and ZeRO 0 or 1.  As for BLOOM (same stack): the
    pipeline engine reduces gradients after the last micro-batch (no overlap), ZeRO-1 all-reduces the
    gradients, gradient accumulation is a separate pass, and each pipeline send and receive is its own
    blocking transfer of 1/tp of the tensor (partitioned buffers; framework deepspeed).  Network: DGX A100, one 200 Gb/s HDR HCA
    per GPU = 25 GB/s.  Metric: SC21 eq. 3 TFLOP/s (`sc21_eq3_tflops`), which reproduces the published
    126/121/113 from the published iteration times (the file shows the check)."""
    c = d["common"]
    spec = ModelSpec(name="mt-nlg-530b", arch="gpt", layers=c["layers"], hidden=c["hidden"], heads=c["heads"],
                     kv_heads=c["heads"], ffn_hidden=4 * c["hidden"], vocab=c["vocab"], tied_embeddings=c["tied_embeddings"])
    for r in d["rows"]:
        variants = [Pins(tp=c["tp"], pp=c["pp"], dp=r["dp"], cp=1, vpp=1, schedule="1f1b", zero=z, recompute=rc,
                         sp=False, offload="none", mbs=r.get("micro_batch_size")) for z in (0, 1) for rc in ("none", "full")]
        yield Query(label=f"{r['gpus']}gpu gbs{r['global_batch_size']}", spec=spec, gpus=r["gpus"],
                    hardware="a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="sc21_eq3_tflops", published=r["tflops_per_gpu"], dtype="fp16", flash_attention=False,
                    precision="master-weights-half-grads",  # DeepSpeed fp16: 16-bit grads, fp32 master (ZeRO-3 rows too)
                    overlap_grad_reduce=False, dropout=True, gpus_per_node=c["gpus_per_node"],
                    inter_node_gbytes_per_s=c["inter_node_gb_s_per_gpu_per_direction"], zero1_grad_reduce="all-reduce",
                    grad_accumulation_fusion=False, pin_variants=variants, framework="deepspeed")


def torchtitan_2024_h100(d: dict) -> Iterable[Query]:
    """torchtitan's published Llama 3.1 8B 1D-FSDP runs (docs/performance.md, Tables 1 and 3) on Meta's
    500 W H100 96GB HBM2e (benchmarks/reference/profiles/h100-hbm2e-96gb-500w.toml: the SXM peak, which
    the source says is an upper bound).  Pinned, as published: tp 1, pp 1, cp 1, dp = all GPUs with
    FSDP2 (ZeRO 3), micro-batch 2, torchtitan's op-level selective checkpointing (selective-op), no SP,
    no offload, fused SDPA attention, fp32 reduce (master-weights), framework torchtitan; the "FSDP" rows
    run eager (fused_elementwise off: torchtitan's training.compile default), the "+ torch.compile" rows
    fused; the "+ Float8" rows with torchao's float8 linears (fp8: tensor-wise dynamic scales, the output layer
    in 16 bits, FSDP's gathers at 16 bits, as the table does not say otherwise).  Two metrics per row: tokens/s per
    GPU, and memory against the logged peak reserved GiB (the model predicts allocated bytes, the same with
    and without compile)."""
    prof = str(reference_dir() / "profiles" / "h100-hbm2e-96gb-500w.toml")
    from .models import load_preset
    spec = load_preset("llama3-8b").model_copy(update={"name": "llama3.1-8b"})  # Llama 3.1 8B: the same shape
    c = d["common"]
    for r in d["rows"]:
        if not r["modelled"]:
            continue
        pins = Pins(tp=1, pp=1, cp=1, dp=r["gpus"], mbs=c["local_batch_size"], zero=3, recompute="selective-op",
                    sp=False, vpp=1, schedule="1f1b", offload="none")
        for metric, published in (("tokens_per_s_per_gpu", r["tps_per_gpu"]), ("memory_gib", r["memory_gib"])):
            yield Query(label=f"8B {r['gpus']}gpu {r['techniques']}", spec=spec, gpus=r["gpus"], hardware=prof,
                        seq_len=c["seq_len"], global_batch_size=r["global_batch_size"], metric=metric,
                        published=published, dtype="bf16", precision="master-weights", flash_attention=True,
                        overlap_grad_reduce=True, grad_accumulation_fusion=False, p2p_scatter_gather=False,
                        fused_cross_entropy=False, fused_elementwise="compile" in r["techniques"],
                        fp8="Float8" in r["techniques"], framework="torchtitan", pin_variants=[pins])


def mpt_llm_foundry_h100(d: dict) -> Iterable[Query]:
    """MosaicML llm-foundry's MPT throughput table on H100 (scripts/train/benchmarking/README.md): 52 runs
    from 760M to 70B at 512 to 65,536 tokens on 8-64 GPUs.  Pinned, as published: FSDP FULL_SHARD over
    every GPU (ZeRO 3, tp = pp = cp = 1), the row's micro-batch, full recompute where the row checkpoints
    activations and none where it does not; flash attention as the runs' attn_impl triton ran it (Tri Dao's
    flash_attn_triton on triton 2.0.0.dev20221202: attention_kernel triton-2022), fp32 sharded masters with bf16 compute and
    fp32 reduce (master-weights), eager pointwise work, and flash-attn's fused cross-entropy over the 16-bit
    logits, its gradient in 16 bits too (llm-foundry's ComposerMPTCausalLM: loss_fn defaults to
    'fused_crossentropy'; cross_entropy_16bit_grad).  The framework is
    fsdp (PyTorch FSDP over an eager torch model): the runs used FSDP1 under Composer.  MPT is parplan's gpt arch exactly (biases, LayerNorm, GeLU, learned positions,
    tied embedding).  Metric: tokens/s per GPU."""
    return _mpt_queries(d)


# llm-foundry's GPU names -> parplan profiles; FSDP mixed precision DEFAULT reduces gradients in fp32, PURE in bf16
# (both over fp32 sharded parameters: FSDP's flat parameter is the master)
_MPT_GPUS = {"h100_80gb": "h100-sxm-80gb", "a100_80gb": "a100-sxm-80gb", "a100_40gb": "a100-sxm-40gb"}
_MPT_PRECISION = {"DEFAULT": "master-weights", "PURE": "master-weights-half-grads"}


def _mpt_queries(d: dict) -> Iterable[Query]:
    c = d["common"]

    def base(r):
        gpu = r.get("gpu", "h100_80gb")
        return f"{r['model']} s{r['seq_len']} {r['gpus']}gpu" + ("" if gpu == "h100_80gb" else f" {gpu[5:]}")
    repeated = {b for b, n in Counter(base(r) for r in d["rows"]).items() if n > 1}
    for r in d["rows"]:
        gpu = r.get("gpu", "h100_80gb")
        spec = _gpt({**c["shapes"][r["model"]], "model": f"mpt-{r['model']}"}, c["vocab"], tied=True)
        pins = Pins(tp=1, pp=1, cp=1, dp=r["gpus"], mbs=r["micro_batch_size"], zero=3, sp=False, vpp=1,
                    schedule="1f1b", offload="none", recompute="full" if r["activation_checkpointing"] else "none")
        label = base(r) + (f" mbs{r['micro_batch_size']}" if base(r) in repeated else "")
        yield Query(label=label, spec=spec, gpus=r["gpus"],
                    hardware=_MPT_GPUS[gpu], seq_len=r["seq_len"], global_batch_size=r["global_batch_size"],
                    metric="tokens_per_s_per_gpu", published=r["tokens_per_s_per_gpu"], dtype="bf16",
                    precision=_MPT_PRECISION[r.get("mp_mode", "DEFAULT")], flash_attention=True,
                    overlap_grad_reduce=True, grad_accumulation_fusion=False, p2p_scatter_gather=False,
                    fused_cross_entropy=True, cross_entropy_16bit_grad=True, fused_elementwise=False,
                    attention_kernel="triton-2022",
                    framework="fsdp", pin_variants=[pins])


def mpt_llm_foundry_a100(d: dict) -> Iterable[Query]:
    """The same llm-foundry benchmark README's two A100 tables (A100 80GB and A100 40GB, both with 1600 Gbps
    node-to-node RoCE = 25 GB/s per GPU): 139 runs from 125M to 70B at 512 to 65,536 tokens on 8-128 GPUs,
    modelled as the H100 table is (mpt_llm_foundry_h100), with each row's FSDP mixed precision: DEFAULT
    reduces gradients in fp32 (master-weights), PURE in bf16 (master-weights-half-grads).  The Triton kernel's
    published ratios to FlashAttention-2 were measured on this GPU.  Metric: tokens/s per GPU."""
    return _mpt_queries(d)


def nemo_padded_vocab(tp: int, divisible_by: int = 128, tokens: int = 50257) -> int:
    """NeMo's padded vocabulary: GPT-2 BPE's 50257 tokens padded to a multiple of make_vocab_size_divisible_by x tp."""
    m = divisible_by * tp
    return -(-tokens // m) * m


NEMO_GPT2_VOCAB = nemo_padded_vocab(8)  # 51200: GPT-2 BPE padded by NeMo to a multiple of 128 x tp 8


def nemo_spec(r: dict, c: dict) -> ModelSpec:
    """The shape a nemo_h100_bf16 row trained: the Llama 3.1 size's shape with the row's layers (the 405B proxies), and
    for the NeMo Launcher 405B runs (releases 24.09 / 24.12) its config's 16 kv groups and GPT-2's padded vocab."""
    shape = dict(c["shapes"][r["model"]], layers=r["layers"])
    if r["model"] == "llama3.1-405b" and r["release"] != "nemo2":
        shape.update(kv_heads=16, vocab=NEMO_GPT2_VOCAB)
    name = r["model"] if r["layers"] == c["shapes"][r["model"]]["layers"] else f"{r['model']}-proxy-{r['layers']}l"
    return ModelSpec(name=name, arch="llama", tied_embeddings=False, rope_theta=500000.0, **shape)


def nemo_h100_bf16(d: dict) -> Iterable[Query]:
    """NVIDIA's DGX Cloud benchmarking recipes for Llama 3.1 8B / 70B / 405B on H100 in BF16 (NeMo 24.09 and 24.12
    through the NeMo Launcher, and a later NeMo-Run / NeMo 2.0 version): the NeMo docs' own H100 dense tables are all
    FP8 (the file says so).  Every layout setting is published and pinned: tp, pp, cp 2, dp, micro-batch 1, the
    virtual stages (interleaved 1F1B; plain 1F1B where there is none), the distributed optimizer (ZeRO 1, gradients
    reduce-scattered), no recompute (the configs' activations_checkpoint_* are null), sequence parallelism with
    tp > 1 (sequence_parallel true for 70B / 405B, tp 1 for 8B), no offload.  Stack: gradient reduce-scatter and
    parameter all-gather overlapped (overlap_grad_sync / overlap_param_sync), userbuffers TP-comm overlap where
    tp > 1 (ub_tp_comm_overlap), Megatron-Core's asynchronous input-gradient collective, TE's ring context
    parallelism, cuDNN fused attention (the profile's curve), gradient-accumulation and cross-entropy fusion, no
    dropout, bf16 with fp32 master weights and fp32 gradients (the reduce dtype is not stated).  Shapes: the Llama
    3.1 presets, with the row's layers for the 405B proxies, and 16 kv groups with GPT-2's padded vocab (51,200) for
    the Launcher's 405B runs (its config; the README: GPT2BPETokenizer as a proxy).  Network: 8 GPUs per node
    stated, the rest the profile's DGX H100.  Metric: tokens/s per GPU (the printed tokens/s, i.e. seq x GBS over
    the step time, over the GPUs); the file's MFU uses parplan's own model-FLOP convention (checked in the tests)."""
    c = d["common"]
    for r in d["rows"]:
        vp = r.get("vp") or 1
        pins = Pins(tp=r["tp"], pp=r["pp"], cp=r["cp"], dp=r["dp"], mbs=r["micro_batch_size"], vpp=vp, zero=1,
                    recompute="none", sp=r["tp"] > 1, schedule="interleaved-1f1b" if vp > 1 else "1f1b", offload="none")
        size = r["model"].rsplit("-", 1)[1]  # 8b, 70b, 405b
        proxy = "" if r["layers"] == c["shapes"][r["model"]]["layers"] else f"-{r['layers']}l"
        label = f"{r['release']} {size}{proxy} {r['gpus']}gpu"
        yield Query(label=label, spec=nemo_spec(r, c), gpus=r["gpus"], hardware="h100-sxm-80gb", seq_len=r["seq_len"],
                    global_batch_size=r["global_batch_size"], metric="tokens_per_s_per_gpu",
                    published=r["tokens_per_s_per_gpu"], dtype="bf16", precision="master-weights", flash_attention=True,
                    overlap_grad_reduce=True, overlap_param_gather=True, overlap_tp_comm=r["tp"] > 1,
                    async_tp_grad_comm=True, overlap_cp_comm=True, dropout=False, gpus_per_node=c["gpus_per_node"],
                    pin_variants=[pins])


def nemo_h100_fp8(d: dict) -> Iterable[Query]:
    """The FP8 twins of nemo_h100_bf16's 24.09 and 24.12 rows and of nemo_launcher_gpt3's DGX Cloud GPT-3 175B rows
    (the same READMEs, the same layouts): every pin and stack setting as there, with the linears in FP8 as
    Transformer Engine runs them under Megatron (Training.fp8: delayed scaling, hybrid format, FP8 weights).  Held
    out; checks the FP8 terms (fp8 peak, fp8_matmul_scale, the casts and the FP8-saved inputs), none fitted to it."""
    for q in nemo_h100_bf16(d):
        q.fp8 = True
        yield q
    # GPT-3 175B: the FP8 twins of nemo_launcher_gpt3's DGX Cloud H100 rows, that set's adapter on them
    with open(reference_dir() / "nemo_launcher_gpt3.json", encoding="utf-8") as f:
        launcher = json.load(f)
    for q in nemo_launcher_gpt3({**launcher, "rows": d.get("gpt3_175b_rows", [])}):
        q.fp8 = True
        yield q


_NEMO_LAUNCHER_175B_LAYOUTS = ((4, 8), (8, 8), (8, 16))  # (tp, pp) searched where the 23.x table does not say


def nemo_launcher_gpt3(d: dict) -> Iterable[Query]:
    """The NeMo Megatron Launcher's GPT-3 5B / 175B throughput as NVIDIA published it: the Launcher README's scaling
    tables on DGX A100 80GB (the 2022 BigNLP-Scripts version and the 2023 NeMo Framework Launcher version) and the
    DGX Cloud recipe's GPT-3 175B BF16 tables on H100 (two versions).  The shape is parplan's gpt arch exactly (the
    configs: LayerNorm, GeLU 4h, biases, learned positions, tied embedding), vocab GPT-2's padded by NeMo for the
    row's tp (nemo_padded_vocab; 51,200 where tp is unknown).  bf16 with fp32 master weights, dropout 0.1 (the
    configs), Megatron's fused kernels and gradient-accumulation fusion.
    Pinned where published: the H100 rows' every setting (tp 4, pp 8, vp 12 interleaved, micro-batch 1, dp, GBS 2 x
    GPUs, no recompute, SP, distributed optimizer with grad/param sync overlapped and bf16 gradient sync, userbuffers
    TP overlap, TE attention); the A100 rows' tp and pp where the README's text states them (BigNLP 22.08: 5B tp 2,
    175B tp 8 / pp 8; Launcher 23.x: 5B tp 1), the optimizer it names (22.08 'Adam': ZeRO 0, gradients all-reduced
    after the backward inside a pipeline, overlapped without one -- NeMo's O2 async all-reduce needs pp 1; 23.x
    'Distributed Adam': ZeRO 1, overlapped), unfused softmax attention (no flash attention in those releases' GPT).
    Searched, as not published: micro-batch, recompute (none / selective / full), SP with tp > 1 on the A100 175B
    rows, and the Launcher 23.x 175B layout (tp 4 / pp 8, tp 8 / pp 8, tp 8 / pp 16, 1F1B or fully interleaved):
    its README's 'tp 8, pp 16' cannot run on the table's 8-node column.  The A100 GBS is the file's
    global_batch_size_used.  Metric: tokens/s per GPU."""
    c = d["common"]
    # "1440: printed for the 160-GPU run ...": the number before the reason
    gbs_used = {k: int(v.split(":", 1)[0]) for k, v in d["global_batch_size_used"].items()}
    for r in d["rows"]:
        shape, table, g = c["shapes"][r["model"]], r["table"], r["gpus"]
        h100 = table.startswith("dgxc")
        vocab = nemo_padded_vocab(r["tp"]) if r["tp"] else NEMO_GPT2_VOCAB
        spec = ModelSpec(name=r["model"], arch="gpt", layers=shape["layers"], hidden=shape["hidden"],
                         heads=shape["heads"], kv_heads=shape["heads"], ffn_hidden=4 * shape["hidden"], vocab=vocab,
                         tied_embeddings=True, max_seq_len=c["seq_len"])
        if h100:
            variants = [Pins(tp=r["tp"], pp=r["pp"], cp=1, dp=r["dp"], mbs=r["micro_batch_size"], vpp=r["vp"],
                             schedule="interleaved-1f1b", zero=1, recompute="none", sp=True, offload="none")]
        else:
            recomputes = ("none", "selective", "full")
            zero = 1 if table == "launcher-23.x" else 0
            layouts = [(r["tp"], r["pp"])] if r["tp"] else _NEMO_LAUNCHER_175B_LAYOUTS
            variants = []
            for tp, pp in layouts:
                if g % (tp * pp):
                    continue
                for vpp in sorted({1, shape["layers"] // pp}) if not r["tp"] else [1]:
                    for sp in ((True, False) if tp > 1 and r["model"] == "gpt3-175b" else (False,)):
                        variants.append(Pins(tp=tp, pp=pp, cp=1, vpp=vpp, zero=zero, sp=sp, offload="none",
                                             schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                                             recomputes=recomputes))
        gbs = r["global_batch_size"] or gbs_used[f"{r['model']} {table}"]
        overlap = h100 or table == "launcher-23.x" or (r["pp"] or 1) == 1
        yield Query(label=f"{table} {r['model'][5:]} {g}gpu", spec=spec, gpus=g,
                    hardware="h100-sxm-80gb" if h100 else "a100-sxm-80gb", seq_len=c["seq_len"], global_batch_size=gbs,
                    metric="tokens_per_s_per_gpu", published=r["tokens_per_s_per_gpu"], dtype="bf16",
                    precision="master-weights-half-grads" if h100 else "master-weights", flash_attention=h100,
                    overlap_grad_reduce=overlap, overlap_param_gather=overlap, overlap_tp_comm=h100,
                    async_tp_grad_comm=True, dropout=True, gpus_per_node=c["gpus_per_node"], pin_variants=variants)


def megatron_moe_h100(d: dict) -> Iterable[Query]:
    """Mixtures of experts under Megatron-Core on H100 in BF16 (cost_models/moe.py): the Megatron-MoE-ModelZoo's
    Qwen3-235B-A22B rows on 256 GPUs (ep 8 inside a node, NCCL's all-to-all or DeepEP; ep 32 across nodes through
    DeepEP: each row's dispatcher, training.moe_dispatcher), and Megatron-LM's Mixtral 8x7B headline
    of MCore v0.8 with its mapping table's layout (plausibility: the row's label says so).  Every printed setting is
    pinned: tp, pp, virtual stages (interleaved 1F1B), ep, micro-batch 1, the distributed optimizer (ZeRO 1), sequence
    parallelism with tp > 1, no block recompute but the ModelZoo's 'norm, act' modules (Megatron's --recompute-modules
    layernorm moe_act: training.moe_recompute norm-act) where a row prints them, Megatron-Core's combined 1F1B
    (training.moe_a2a_overlap) where a row's note says '+1f1b overlap', no offload.  Stack: overlapped gradient reduce-scatter and parameter gather, Megatron-Core's
    asynchronous input-gradient collective, no TP-comm overlap, no dropout.  Metric: the Qwen3 rows' printed step
    time as tokens/s per GPU; the Mixtral headline's TFLOP/s per GPU (parplan's model FLOPs are Megatron-Core's MoE
    count of 2024)."""
    c = d["common"]
    for r, metric in [(r, "tokens_per_s_per_gpu") for r in d["rows"]] + \
            [(r, "model_tflops_per_gpu") for r in d["plausibility_rows"]]:
        spec = ModelSpec(name=r["model"], arch="llama", tied_embeddings=False, rope_theta=1e6,
                         **c["shapes"][r["model"]])
        yield _megatron_moe_query(r, spec, metric, moe_recompute=r.get("moe_recompute", "none"),
                                  moe_a2a_overlap=r.get("moe_a2a_overlap", False))


def _megatron_moe_query(r: dict, spec: ModelSpec, metric: str = "tokens_per_s_per_gpu",
                        precision: str = "master-weights", **stack) -> Query:
    """A published Megatron-Core MoE row on H100 in BF16 as a query: every printed setting pinned (tp, pp, cp,
    virtual stages under interleaved 1F1B, ep, the micro-batch, the distributed optimizer as ZeRO 1, sequence
    parallelism with tp > 1, no block recompute or offload), Megatron-Core's stack (overlapped gradient reduce-scatter
    and parameter gather, the asynchronous input-gradient collective, no TP-comm overlap, no dropout), the row's
    dispatcher; `stack`: the row's recompute modules; precision: its gradients' (master-weights: reduced in fp32).
    The metric: tokens/s per GPU, printed or from the printed step time, or (model_tflops_per_gpu) the printed
    TFLOP/s per GPU, a plausibility row."""
    vp = r.get("vp") or 1
    dp = r["gpus"] // (r["tp"] * r["pp"] * r["cp"])
    pins = Pins(tp=r["tp"], pp=r["pp"], cp=r["cp"], dp=dp, mbs=r["micro_batch_size"], vpp=vp, zero=1,
                recompute="none", sp=r["tp"] > 1, schedule="interleaved-1f1b" if vp > 1 else "1f1b",
                offload="none", ep=r["ep"])
    if metric != "tokens_per_s_per_gpu":
        published = r["model_tflops_per_gpu"]
    elif "step_time_s" in r:
        published = r["global_batch_size"] * r["seq_len"] / r["step_time_s"] / r["gpus"]
    else:  # only the rate printed (Megatron-Bridge's performance summary)
        published = r["tokens_per_s_per_gpu"]
    label = r["label"] + (" (plausibility)" if metric == "model_tflops_per_gpu" else "")
    return Query(label=label, spec=spec, gpus=r["gpus"], hardware="h100-sxm-80gb", seq_len=r["seq_len"],
                 global_batch_size=r["global_batch_size"], metric=metric, published=published, dtype="bf16",
                 precision=precision, overlap_grad_reduce=True, overlap_param_gather=True,
                 overlap_tp_comm=False, async_tp_grad_comm=True, dropout=False, gpus_per_node=8,
                 moe_dispatcher=r.get("moe_dispatcher", "alltoall"), pin_variants=[pins], **stack)


def megatron_deepseek_h100(d: dict) -> Iterable[Query]:
    """DeepSeek-V3 (multi-head latent attention, 3 dense blocks before 58 MoE ones, 256 experts top 8 and a shared
    one) on 512 and 1,024 H100 in BF16 under Megatron-Core, NVIDIA's DGX Cloud benchmarking release 25.05.04 (NeMo
    25.04.01): every printed setting pinned (tp 2, pp 8 or 16, ep 64, micro-batch 1, no virtual stages), the
    distributed optimizer (ZeRO 1), sequence parallelism, the launch's --recompute-modules mla_up_proj
    (training.mla_recompute), the all-to-all dispatcher (inferred: the token-drop callback asserts it; its capacity
    factor 1.0 with padding runs every expert at its balanced share, what parplan predicts).  Stack as
    megatron_moe_h100's (overlapped gradient reduce-scatter and parameter gather, asynchronous input-gradient
    collective, no TP-comm overlap), gradients reduced in bf16 as the launches set (grad_reduce_in_fp32 false:
    master-weights-half-grads), and the multi-token-prediction layer its FLOP count shows (mtp_num_layers 1:
    model.mtp_layers), on the last pipeline stage as Megatron places it, a block of the split
    (layout.model_stage_layers: the launches' own 7 / 8 x 6 / 6 and 3 / 4 x 14 / 2 blocks).  Metric: tokens/s per GPU from the printed step time."""
    s = d["common"]["shape"]
    shape = dict(arch="llama", layers=s["layers"], hidden=s["hidden"], heads=s["heads"], kv_heads=s["heads"],
                 head_dim=s["qk_nope_head_dim"] + s["qk_rope_head_dim"], ffn_hidden=s["moe_ffn_hidden"],
                 vocab=s["vocab"], experts=s["experts"], experts_per_token=s["experts_per_token"],
                 shared_expert_ffn=s["shared_experts"] * s["shared_ffn_hidden"], first_dense_layers=s["first_k_dense"],
                 dense_ffn_hidden=s["dense_ffn_hidden"], kv_lora_rank=s["kv_lora_rank"], q_lora_rank=s["q_lora_rank"],
                 qk_rope_head_dim=s["qk_rope_head_dim"], v_head_dim=s["v_head_dim"])
    for r in d["rows"]:
        spec = ModelSpec(name=r["model"], tied_embeddings=False, mtp_layers=r.get("mtp_num_layers") or None, **shape)
        # the launches reduce gradients in bf16 (grad_reduce_in_fp32 false; until 2026-12-06 planned in fp32, when the
        # model still charged 16-bit gradients an accumulation pass Megatron-LM's fusion does not make)
        precision = "master-weights" if r.get("grad_reduce_in_fp32", True) else "master-weights-half-grads"
        yield _megatron_moe_query(r, spec, precision=precision, mla_recompute=r["mla_recompute"])


def megatron_gpt_oss_h100(d: dict) -> Iterable[Query]:
    """gpt-oss-120b on 64 H100 in BF16 under Megatron-Core, Megatron-Bridge's performance summary (releases 26.02 to
    26.04.01, one layout): every printed setting pinned (tp 1, pp 4, ep 8, micro-batch 1, no virtual stages), the
    distributed optimizer (ZeRO 1), the perf recipe's recompute modules layernorm and moe_act (training.moe_recompute
    norm-act), NCCL's all-to-all dispatcher, gradients reduced in bf16 (grad_reduce_in_fp32 False: precision
    master-weights-half-grads); the rest of the stack as megatron_moe_h100's.  The model: parplan's gpt-oss-120b
    preset, whose windowed half of the blocks Megatron-LM trains within the window.  Metric: the printed tokens/s per
    GPU."""
    from .models import load_preset
    for r in d["rows"]:
        yield _megatron_moe_query(r, load_preset(r["model"]), moe_recompute="norm-act",
                                  precision="master-weights-half-grads")


ADAPTERS: dict[str, Callable[[dict], Iterable[Query]]] = {
    "megatron_sc21_table1": megatron_sc21_table1,
    "megatron_h100_2024": megatron_h100_2024,
    "korthikanti2022_selective_recompute": korthikanti2022_selective_recompute,
    "megatron_sc21_table2_zero3": megatron_sc21_table2_zero3,
    "llama3_405b_table4": llama3_405b_table4,
    "bloom_176b": bloom_176b,
    "mt_nlg_530b": mt_nlg_530b,
    "opt_175b": opt_175b,
    "gpt_neox_20b": gpt_neox_20b,
    "torchtitan_2024_h100": torchtitan_2024_h100,
    "mpt_llm_foundry_h100": mpt_llm_foundry_h100,
    "mpt_llm_foundry_a100": mpt_llm_foundry_a100,
    "nemo_h100_bf16": nemo_h100_bf16,
    "nemo_h100_fp8": nemo_h100_fp8,
    "nemo_launcher_gpt3": nemo_launcher_gpt3,
    "megatron_moe_h100": megatron_moe_h100,
    "megatron_deepseek_h100": megatron_deepseek_h100,
    "megatron_gpt_oss_h100": megatron_gpt_oss_h100,
}
# Sets whose profile parameter was fitted to them (at most one parameter per profile).
FITTED_ON = {"megatron_h100_2024": "h100-sxm-80gb sustained_matmul_fraction",
             "megatron_sc21_table1": "a100-sxm-80gb sustained_matmul_fraction"}
# Sets the reference README calls low-detail / plausibility checks (a peak, or an unverified figure).
PLAUSIBILITY_ONLY = {"opt_175b": "published figure is an 'up to' peak with unknown FLOP convention",
                     "gpt_neox_20b": "117 TFLOP/s found only in a secondary summary; FLOP convention unknown",
                     "torchtitan_2024_h100": "500 W H100 96GB of unknown peak (between NVL and SXM; the SXM peak is used)"}


def _recommend_kwargs(q: Query, hardware_override: str | None) -> dict:
    from .core import STACK_FLAGS
    return dict(hardware=hardware_override or q.hardware, seq_len=q.seq_len, global_batch_size=q.global_batch_size,
                dtype=q.dtype, precision=q.precision, gpus_per_node=q.gpus_per_node,
                inter_node_gbytes_per_s=q.inter_node_gbytes_per_s, top_k=1, suggest=False, framework=q.framework,
                **{k: getattr(q, k) for k in STACK_FLAGS})


def run_query(q: Query, hardware_override: str | None = None):
    """Best plan over the query's pin variants (the publication's framework picks the best it can)."""
    from .core import NothingFits, PlannerError, recommend
    best = None
    for pins in q.pin_variants:
        # the published runs state their data parallelism, and none of them shards within a node only (hybrid
        # sharding, which recommend searches for parplan, torchtitan and fsdp): full sharding unless a query pins it
        pins = replace(pins, dp_replicate=pins.dp_replicate or 1)
        try:
            plan = recommend(q.spec, q.gpus, pins=pins, **_recommend_kwargs(q, hardware_override))
        except (NothingFits, PlannerError):
            continue
        if best is None or plan.prediction.step_time_s < best.prediction.step_time_s:
            best = plan
    return best


def why_infeasible(q: Query, hardware_override: str | None = None) -> str:
    """One line on why no pin variant gave a plan (lowest-memory candidate, or no candidate at all)."""
    from .core import NothingFits, PlannerError, recommend
    best = None
    error = None
    for pins in q.pin_variants:
        try:
            recommend(q.spec, q.gpus, pins=pins, **_recommend_kwargs(q, hardware_override))
        except NothingFits as e:
            plan = getattr(e, "plan", None)
            pred = getattr(plan, "prediction", None)
            if pred is not None:
                mem = pred.memory_bytes_per_gpu.total
                if best is None or mem < best[0]:
                    best = (mem, pred.usable_memory_bytes)
        except PlannerError as e:
            error = error or str(e)
            continue
    if best is None:
        return f"no feasible plan: {error}" if error else "no feasible plan: no layout matches the pins"
    usable = f" > {best[1] / 1e9:.1f} GB usable" if best[1] else ""
    return f"no feasible plan: least memory {best[0] / 1e9:.1f} GB/GPU{usable}"


def validate_set(name: str, data: dict, hardware_override: str | None = None) -> list[Case]:
    from .core import gpu_count_problem
    cases = []
    for q in ADAPTERS[name](data):
        problem = gpu_count_problem(q.gpus)
        if problem:  # the row's fault, not a layout's (run_query would read recommend's refusal as "no feasible plan")
            raise ValueError(f"row {q.label!r}: {problem}")
        plan = run_query(q, hardware_override)
        pred = None if plan is None else metric_value(plan, q)
        note = why_infeasible(q, hardware_override) if plan is None else _case_note(plan, q)
        cases.append(Case(set_name=name, label=q.label, metric=q.metric, published=q.published, predicted=pred,
                          plan=plan, note=note))
    return cases


def _case_note(plan, q: Query) -> str:
    if q.metric == "mfu_causal":
        return f"no causal discount: mfu {plan.prediction.mfu:.3f}"
    if q.spec.name == "llama3-405b" and q.metric == "mfu":
        return f"causally discounted: {mfu_causal(plan, q):.3f}"
    return ""


def available_sets(directory: Path | None = None) -> list[str]:
    directory = directory or reference_dir()
    return [n for n in ADAPTERS if (directory / f"{n}.json").exists()]


class ReferenceFileError(ValueError):
    """A reference set's file that its adapter cannot read: the file's fault, said in one line."""


def validate_all(names: list[str] | None = None, directory: Path | None = None,
                 hardware_override: str | None = None) -> list[Case]:
    directory = directory or reference_dir()
    if hardware_override is not None:
        from .core import load_hardware
        load_hardware(hardware_override)  # a bad profile is refused as the profile's fault, before any set blames itself
    out = []
    for name in names or available_sets(directory):
        path = directory / f"{name}.json"
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReferenceFileError(f"reference set {path}: cannot read it as JSON ({e})") from None
        from .schema import json_type_name
        if not isinstance(data, dict):
            raise ReferenceFileError(f"reference set {path}: the top level must be a JSON object (with its rows), "
                                     f"not {json_type_name(data)}; compare with the set's shipped file in "
                                     "benchmarks/reference/")
        rows = data.get("rows")
        if rows is not None and not isinstance(rows, list):
            raise ReferenceFileError(f"reference set {path}: its rows must be a JSON list, not {json_type_name(rows)}; "
                                     "compare with the set's shipped file in benchmarks/reference/")
        try:
            cases = validate_set(name, data, hardware_override)
            for c in cases:  # every row's published figure, before anything divides by it
                if isinstance(c.published, bool) or not isinstance(c.published, (int, float)) or \
                        not math.isfinite(c.published) or c.published <= 0:
                    raise ValueError(f"row {c.label!r}: its published {c.metric} is {c.published!r}, not a positive "
                                     "number")
        except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError) as e:
            # a ValueError here is the row's: a pydantic ValidationError of the plan built from it (gpus 0, a
            # negative sequence), or the check above
            if isinstance(e, KeyError):
                what = f"missing key {e}"
            elif isinstance(e, ValidationError):
                what = f"{e.title} {validation_summary(e, 1)}"
            elif isinstance(e, ValueError):
                what = " ".join(str(e).split())
            else:
                what = f"{e.__class__.__name__}: {e}"
            raise ReferenceFileError(f"reference set {path}: {what} (compare with the set's shipped file in "
                                     "benchmarks/reference/)") from None
        if not cases:
            raise ReferenceFileError(f"reference set {path}: no rows to predict (compare with the set's shipped file "
                                     "in benchmarks/reference/)")
        out.extend(cases)
    return out



def summarize(cases: list[Case]) -> dict:
    """Per set: median and max absolute relative error, and Spearman rank correlation."""
    out = {}
    for name in dict.fromkeys(c.set_name for c in cases):
        cs = [c for c in cases if c.set_name == name and c.predicted is not None]
        errs = np.array([abs(c.error) for c in cs])
        pub = np.array([c.published for c in cs])
        pred = np.array([c.predicted for c in cs])
        out[name] = {"runs": len(cs), "missing": sum(1 for c in cases if c.set_name == name and c.predicted is None),
                     "median_abs_error": float(np.median(errs)) if len(errs) else None,
                     "max_abs_error": float(errs.max()) if len(errs) else None,
                     "spearman": spearman(pred, pub) if len(cs) > 2 else None,
                     "fitted": FITTED_ON.get(name), "plausibility_only": PLAUSIBILITY_ONLY.get(name)}
    return out


def framework_summary(cases: list[Case], digits: int | None = None) -> dict:
    """Per framework the predictions modelled: runs, median and max |error| over every predicted published
    run (sets marked plausibility-only counted apart); rounded to `digits` where given (planner/data/
    accuracy.json keeps 4), else as computed, like summarize's."""
    def r(x: float) -> float:
        return x if digits is None else round(x, digits)
    from .accuracy import gpu_kind, group
    groups: dict[str, dict[str, list[float]]] = {}
    by_gpu: dict[str, dict[str, list[float]]] = {}
    for c in cases:
        if c.predicted is None or c.plan is None:
            continue
        # a set marked plausibility-only, or a row its adapter labels so (megatron_moe_h100's Mixtral headline)
        kind = "plausibility" if c.set_name in PLAUSIBILITY_ONLY or c.label.endswith("(plausibility)") else "held"
        fw = group(c.plan.training.framework, c.plan.model.is_moe)
        groups.setdefault(fw, {"held": [], "plausibility": [], "latent": []})[kind].append(abs(c.error))
        if kind == "held" and c.plan.model.kv_lora_rank is not None:  # multi-head latent attention's (DeepSeek-V3's)
            groups[fw]["latent"].append(abs(c.error))
        gpu = gpu_kind(c.plan.hardware.name)
        if kind == "held" and gpu:
            by_gpu.setdefault(fw, {}).setdefault(gpu, []).append(abs(c.error))
    out = {}
    for fw, g in sorted(groups.items()):
        held, plaus = np.array(g["held"]), np.array(g["plausibility"])
        out[fw] = {"runs": len(held),
                   "median_abs_error": r(float(np.median(held))) if len(held) else None,
                   "max_abs_error": r(float(held.max())) if len(held) else None,
                   "plausibility_runs": len(plaus),
                   "plausibility_median_abs_error": r(float(np.median(plaus))) if len(plaus) else None,
                   "by_gpu": {gpu: {"runs": len(e), "median_abs_error": r(float(np.median(e))),
                                    "max_abs_error": r(float(max(e)))}
                              for gpu, e in sorted(by_gpu.get(fw, {}).items())}}
        if g["latent"]:  # of the held runs, those of a model with multi-head latent attention
            out[fw]["latent_attention"] = {"runs": len(g["latent"]),
                                           "median_abs_error": r(float(np.median(g["latent"]))),
                                           "max_abs_error": r(float(max(g["latent"])))}
    return out


def spearman(a, b) -> float:
    """Spearman rank correlation with average ranks for ties (no scipy needed)."""
    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):
            idx = x == v
            r[idx] = r[idx].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
    return float((ra * rb).sum() / denom) if denom else 0.0
