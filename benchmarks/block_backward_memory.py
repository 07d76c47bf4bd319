"""What one transformer block holds for its backward, and how much more its backward allocates.

    python benchmarks/block_backward_memory.py [--json OUT] [--device cpu|cuda] [--trace] [--only NAME]

(blocks: megatron-gpt, parplan-llama, parplan-llama-gqa, parplan-gpt; --only takes a prefix)

Builds single blocks in plain torch on CPU (fp32, tp 1) and replays the CPU allocator's trace
(torch.profiler profile_memory, as parallel_layers/host_memory.py does) over one forward and one
backward; a second block runs on top, so the measured block's output gradient is made and freed by
autograd as in training; only the input's gradient is asked for (the weights require gradients, so
the forward saves what training saves, but their gradients -- model states -- are not made):
  - saved: bytes live after the block's forward, less its output and what was live before it
    (the activations the block saved for its backward);
  - over: the peak after the block's backward starts (its output gradient complete) above what was
    live then: the backward's temporaries (input gradients in flight; under recompute the re-run
    forward's activations too);
  - the op whose allocation made that peak.
fp32 because the CPU's bf16 matmuls convert their operands into fp32 scratch that a GPU's GEMMs do
not make; the model is evaluated with 4-byte activations.
Blocks:
  - megatron-gpt: Megatron-LM's 2021 GPT block as the published runs ran it: LayerNorm, fused QKV,
    unfused attention (baddbmm scores, softmax, attention dropout, bmm; in a function of its own, as
    Megatron's CoreAttention module, so its raw scores are freed when it returns), output projection,
    dropout + residual, LayerNorm, fc1, GeLU, fc2, dropout + residual (Korthikanti 2022 Sec. 4.1
    counts its saved bytes as s b h (34 + 5 a s / h)); dropout keeps a 1-byte mask and makes one
    tensor each way, as CUDA's kernel does (torch's CPU kernel keeps the mask in the input dtype);
  - parplan-llama / parplan-gpt: parplan's own runtime blocks (parallel_layers.model.Block, SDPA).
Both with and without full recompute (torch.utils.checkpoint, non-reentrant).  Prints the model's
terms beside: cost_models.memory.activation_bytes_per_layer, and backward_temporaries_per_layer plus
the recomputed activations (activation_bytes_working_layer - activation_bytes_per_layer).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# fp32: the CPU's bf16 matmuls convert their operands into fp32 scratch buffers, which a GPU's GEMMs
# do not; in fp32 they allocate only their outputs.  The model is evaluated with 4-byte activations.
DT = torch.float32
ACT_BYTES = 4
DEVICE = "cpu"
TRACE = False  # cuda: the profiler's allocation trace instead of the allocator's counters


def configure(device: str) -> None:
    """cpu: fp32 (above); cuda: bf16, as training runs, measured with the caching allocator's counters."""
    global DT, ACT_BYTES, DEVICE
    DEVICE = device
    DT, ACT_BYTES = (torch.bfloat16, 2) if device == "cuda" else (torch.float32, 4)


class _Dropout(torch.autograd.Function):
    """Dropout as CUDA runs it: a 1-byte mask saved, one output forward and one gradient backward
    (torch's CPU kernel keeps the mask in the input's dtype)."""

    @staticmethod
    def forward(ctx, x, p):
        keep = torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.where(keep, x, 0.0).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors  # one new tensor (a bool x float product would copy the mask)
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None


def dropout(x, p):
    return _Dropout.apply(x, p)


def gpt_params(h, ffn):
    def w(*s):
        return (torch.randn(*s, dtype=DT, device=DEVICE) * 0.02).requires_grad_()
    return dict(ln1_w=w(h), ln1_b=w(h), qkv_w=w(3 * h, h), qkv_b=w(3 * h), o_w=w(h, h), o_b=w(h),
                ln2_w=w(h), ln2_b=w(h), fc1_w=w(ffn, h), fc1_b=w(ffn), fc2_w=w(h, ffn), fc2_b=w(h))


def core_attention(q, k, v, p_drop):
    """Megatron's CoreAttention: its own module, so the raw scores (a local) are freed when it returns."""
    ba, s, d = q.shape
    scores = torch.baddbmm(torch.empty(ba, s, s, dtype=q.dtype, device=q.device), q, k.transpose(1, 2), beta=0.0,
                           alpha=1.0 / math.sqrt(d))
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return torch.bmm(dropout(probs, p_drop), v)


def gpt_block(x, P, a, p_drop=0.1):
    """x: [s, b, h] (Megatron's layout)."""
    s, b, h = x.shape
    d = h // a
    ln = F.layer_norm(x, (h,), P["ln1_w"], P["ln1_b"])
    qkv = F.linear(ln, P["qkv_w"], P["qkv_b"]).view(s, b, a, 3 * d)
    q, k, v = qkv.split(d, dim=-1)
    q = q.reshape(s, b * a, d).transpose(0, 1)  # [b a, s, d]
    k = k.reshape(s, b * a, d).transpose(0, 1)
    v = v.reshape(s, b * a, d).transpose(0, 1)
    ctx = core_attention(q, k, v, p_drop).transpose(0, 1).reshape(s, b, h)
    x = x + dropout(F.linear(ctx, P["o_w"], P["o_b"]), p_drop)
    ln = F.layer_norm(x, (h,), P["ln2_w"], P["ln2_b"])
    y = F.linear(F.gelu(F.linear(ln, P["fc1_w"], P["fc1_b"]), approximate="tanh"), P["fc2_w"], P["fc2_b"])
    return x + dropout(y, p_drop)


def llama_params(h, ffn):
    def w(*s):
        return (torch.randn(*s, dtype=DT, device=DEVICE) * 0.02).requires_grad_()
    return dict(n1=w(h), wq=w(h, h), wk=w(h, h), wv=w(h, h), wo=w(h, h), n2=w(h), gate=w(ffn, h), up=w(ffn, h),
                down=w(h, ffn))


def llama_block(x, P, a):
    """x: [b, s, h]."""
    b, s, h = x.shape
    d = h // a
    n = F.rms_norm(x, (h,), P["n1"])
    q = F.linear(n, P["wq"]).view(b, s, a, d).transpose(1, 2)
    k = F.linear(n, P["wk"]).view(b, s, a, d).transpose(1, 2)
    v = F.linear(n, P["wv"]).view(b, s, a, d).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
    x = x + F.linear(o, P["wo"])
    n = F.rms_norm(x, (h,), P["n2"])
    return x + F.linear(F.silu(F.linear(n, P["gate"])) * F.linear(n, P["up"]), P["down"])


def parplan_block(kind, s, h, a, ffn, kv, recompute="none"):
    """parplan's own runtime block (parallel_layers.model.Block, tp 1, kv key/value heads), bf16 on CUDA;
    recompute "selective" is inside the block (its attention core and MLP activation checkpointed)."""
    from parallel_layers.model import Block, ModelConfig, init_parameters
    cfg = ModelConfig(arch=kind.split("-")[1], layers=1, hidden=h, heads=a, kv_heads=kv, ffn_hidden=ffn, vocab=512,
                      head_dim=h // a, tied_embeddings=False, max_seq_len=s)
    blk = Block(cfg, 0, None, False, recompute)
    init_parameters(blk, 0)
    blk.to(device=DEVICE, dtype=DT)
    return dict(blk.named_parameters()), lambda x, P, a: blk(x)


def measure(kind, s, b, h, a, ffn, kv, recompute):
    """recompute: "none", "selective" (parplan blocks only) or "full" (the whole block checkpointed)."""
    torch.manual_seed(0)
    if kind.startswith("parplan"):
        P, fn = parplan_block(kind, s, h, a, ffn, kv, "selective" if recompute == "selective" else "none")
    else:
        P = gpt_params(h, ffn) if kind == "megatron-gpt" else llama_params(h, ffn)
        fn = gpt_block if kind == "megatron-gpt" else llama_block
    shape = (s, b, h) if kind == "megatron-gpt" else (b, s, h)
    x = torch.randn(*shape, dtype=DT, device=DEVICE, requires_grad=True)
    dy = torch.randn(*shape, dtype=DT, device=DEVICE)
    run = (lambda t: checkpoint(fn, t, P, a, use_reentrant=False)) if recompute == "full" else (lambda t: fn(t, P, a))
    if DEVICE == "cuda" and not TRACE:
        return measure_cuda(run, x, dy)
    if DEVICE == "cuda":
        torch.autograd.grad(run(run(x)), x, dy)  # warm-up: workspaces and lazy inits stay out of the trace
        torch.cuda.synchronize()

    def mark(grad):  # the measured block's output gradient is complete: its backward starts
        with record_function("phase.bwd"):
            pass

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=acts, profile_memory=True) as prof:
        with record_function("phase.fwd"):
            y1 = run(x)
        y1.register_hook(mark)
        # a second block on top, so the measured block's output gradient comes from autograd and is
        # freed when consumed, as in training (a caller's dy would stay alive through the backward)
        y = run(y1)
        # the input's gradient only: the forward saves what training saves (the weights require
        # gradients), the backward skips the weight gradients (counted with the model states)
        torch.autograd.grad(y, x, dy)
    return replay(prof, y1.numel() * y1.element_size())


def measure_cuda(run, x, dy):
    """The same two numbers from the CUDA caching allocator's counters (allocated bytes, its peak reset
    when the measured block's backward starts): what a GPU's kernels (flash attention's backward, cuBLAS)
    allocate, which a CPU trace cannot show."""
    torch.autograd.grad(run(run(x)), x, dy)  # warm-up: cuBLAS and attention workspaces, lazy inits
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y1 = run(x)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    mark = {}

    def at_backward(grad):
        torch.cuda.synchronize()
        mark["at"] = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    y1.register_hook(at_backward)
    y = run(y1)
    torch.autograd.grad(y, x, dy)
    torch.cuda.synchronize()
    return {"saved": after - before - y1.numel() * y1.element_size(),
            "over": torch.cuda.max_memory_allocated() - mark["at"], "peak_op": "(cuda counters)"}


def replay(prof, out_bytes):
    from torch._C._profiler import _EventType
    allocs, phases = [], {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == DEVICE:
            par = node.parent
            while par is not None and par.name in ("aten::empty", "aten::empty_strided", "aten::empty_like"):
                par = par.parent
            allocs.append((node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.ptr,
                           par.name if par is not None else "?"))
        elif node.name.startswith("phase."):
            phases[node.name[6:]] = (node.start_time_ns, node.end_time_ns)
    allocs.sort(key=lambda e: e[0])
    live, total, made = {}, 0, {}
    before_fwd = after_fwd = at_bwd = None
    peak_bwd, peak_op, at_peak = -1, None, {}
    for t, size, ptr, op in allocs:
        if size > 0:
            total -= live.pop(ptr, 0)
            live[ptr] = size
            made[ptr] = (size, op, t)
            total += size
        elif ptr in live:
            total -= live.pop(ptr)
        if t < phases["fwd"][0]:
            before_fwd = total
        if t <= phases["fwd"][1]:
            after_fwd = total
        if t <= phases["bwd"][0]:
            at_bwd = total
        elif total > peak_bwd:
            peak_bwd, peak_op = total, op
            at_peak = {p: made[p] for p in live if made[p][2] > phases["bwd"][0]}
    before_fwd = before_fwd or 0
    saved = after_fwd - before_fwd - out_bytes
    # "over": the peak after the measured block's backward starts, above what was live then (its saved
    # activations, its output gradient, and what the rest of the step holds throughout)
    # what the backward allocated that is live at its peak, by the op that allocated it
    by_op: dict[str, int] = {}
    for size, op, _ in at_peak.values():
        by_op[op] = by_op.get(op, 0) + size
    return {"saved": saved, "over": peak_bwd - at_bwd, "peak_op": peak_op,
            "live_at_peak": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}


def model_terms(kind, s, b, h, a, ffn, kv, recompute):
    from cost_models.layout import REC_FULL, REC_NONE, REC_SELECTIVE, ModelDims, Layout
    from cost_models import memory
    m = ModelDims(arch="gpt" if kind == "megatron-gpt" else "llama", layers=1, hidden=h, heads=a, kv_heads=kv,
                  head_dim=h // a, ffn=ffn, vocab=32000, seq_len=s, tied=False, positions=0)
    rec = {"none": REC_NONE, "selective": REC_SELECTIVE, "full": REC_FULL}[recompute]
    lay = Layout(tp=1, pp=1, dp=1, cp=1, vpp=1, mbs=b, zero=0, recompute=rec, sp=0,
                 schedule=0, offload=0, gpus=1)
    flash, dropout = kind != "megatron-gpt", kind == "megatron-gpt"
    m = ModelDims(**{**m.__dict__, "arch": "gpt" if "gpt" in kind else "llama"})
    return {"saved": float(memory.activation_bytes_per_layer(m, lay, ACT_BYTES, flash, dropout)),
            "over": float(memory.backward_temporaries_per_layer(m, lay, ACT_BYTES, flash, dropout)
                          + memory.activation_bytes_working_layer(m, lay, ACT_BYTES, flash, dropout)
                          - memory.activation_bytes_per_layer(m, lay, ACT_BYTES, flash, dropout))}


CASES = [  # kind, s, b, h, a, ffn, key/value heads
    ("megatron-gpt", 512, 2, 256, 8, 1024, 8),    # scores dominate: 5as/h = 80 against 34
    ("megatron-gpt", 256, 2, 512, 4, 2048, 4),    # 5as/h = 10
    ("megatron-gpt", 128, 4, 1024, 8, 4096, 8),   # 5as/h = 5
    ("parplan-llama", 256, 2, 512, 8, 1408, 8),
    ("parplan-llama", 512, 2, 256, 4, 704, 4),
    ("parplan-llama-gqa", 256, 2, 512, 8, 1408, 4),
    ("parplan-gpt", 256, 2, 512, 8, 2048, 8),
]


CASES_CUDA = [  # a 1.3B-class block at the H100 grid's shapes (seq 2048, micro-batch 4)
    ("megatron-gpt", 2048, 4, 2048, 16, 8192, 16),
    ("parplan-llama", 2048, 4, 2048, 16, 5632, 16),
    # the grid's llama-1.3b block (8 key/value heads): on the H100 its selective-recompute run held
    # 2 (q width - kv width) bytes per token and layer less than its none run, which the model counts equal
    ("parplan-llama-gqa", 2048, 4, 2048, 16, 5632, 8),
    ("parplan-gpt", 2048, 4, 2048, 16, 8192, 16),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cpu: the allocator trace in fp32; cuda: bf16, training-sized shapes, the caching "
                         "allocator's counters (what GPU kernels add)")
    ap.add_argument("--trace", action="store_true",
                    help="cuda: replay the profiler's allocation trace (and list what is live at the backward's "
                         "peak, by op) instead of reading the allocator's counters")
    ap.add_argument("--only", help="only blocks whose name starts with this")
    args = ap.parse_args(argv)
    configure(args.device)
    global TRACE
    TRACE = args.trace
    torch.set_num_threads(1)
    rows = []
    print("| block | s | b | h | a | kv | ffn | recompute | saved MB | model MB | err | backward over saved MB | model MB | err | peak op |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, s, b, h, a, ffn, kv in (CASES_CUDA if args.device == "cuda" else CASES):
        if args.only and not kind.startswith(args.only):
            continue
        for rc in ("none", "selective", "full") if kind.startswith("parplan-llama") else ("none", "full"):
            meas = measure(kind, s, b, h, a, ffn, kv, rc)
            pred = model_terms(kind, s, b, h, a, ffn, kv, rc)
            row = dict(block=kind, s=s, b=b, h=h, a=a, kv_heads=kv, ffn=ffn, recompute=rc, measured=meas,
                       predicted=pred)
            rows.append(row)
            # under full recompute a block saves only its input, the block below's output (already live)
            e1 = "input" if rc == "full" else f"{pred['saved'] / meas['saved'] - 1:+.1%}"
            e2 = pred["over"] / meas["over"] - 1
            print(f"| {kind} | {s} | {b} | {h} | {a} | {kv} | {ffn} | {rc} | {meas['saved'] / 1e6:.2f} | "
                  f"{pred['saved'] / 1e6:.2f} | {e1} | {meas['over'] / 1e6:.2f} | {pred['over'] / 1e6:.2f} | "
                  f"{e2:+.1%} | {meas['peak_op']} |")
            if meas.get("live_at_peak"):
                print("    live at the backward's peak (allocated in it), MB by op: " + ", ".join(
                    f"{op} {b / 1e6:.1f}" for op, b in list(meas["live_at_peak"].items())[:8]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
