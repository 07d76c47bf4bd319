"""DeepSeek-V3's published H800 rate against parplan's plan of its report's layout, with and without its all-to-alls
hidden behind another micro-batch's compute: a what-if, not a plan parplan makes.

    python benchmarks/deepseek_h800_overlap.py

DeepSeek-V3's report (arXiv 2412.19437): 2,664K H800 GPU hours for 14.8T tokens, 2,048 GPUs, pp 16, ep 64, ZeRO-1,
FP8 linears, one multi-token-prediction layer, DualPipe, which runs a forward chunk and a backward chunk of two
micro-batches at once so that each one's all-to-alls hide behind the other's compute.  parplan plans the layout as
1F1B (docs/accuracy.md, its H800 paragraph).  Megatron-Core's combined 1F1B (`--moe-a2a-overlap`, the same pairing)
needs interleaving on a pipeline, which at pp 16 does not fit the report's batch in 80 GB, so the overlap cannot be
planned here; this script prices the report's 1F1B layout as if every block pass were paired (its warm-up and
cool-down included: a bound on what the pairing hides), through the same cost model (cost_models.moe.
overlapped_all_to_alls with no unpaired pass).  A third row adds what DualPipe changes beyond the pairing, by the
report's own account (its section 3.2.1 and Table 2): the pipeline bubble (PP/2 - 1)(F&B + B - 3W) in place of
1F1B's (PP - 1)(F + B), F, B and W a stage's forward, full backward and weight-gradient pass, F&B a forward and a
backward overlapped (their compute, f + b + w, the all-to-alls being paired), and the pipeline's sends hidden ("both
all-to-all and PP communication can be fully hidden").  Its memory (two copies of the parameters, PP + 1 micro-batches
of activations on the first rank) is not checked.  tests/test_moe_a2a_overlap.py holds docs/accuracy.md's numbers.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np

PUBLISHED_TOKENS_PER_S_GPU = 14.8e12 / (2664e3 * 3600)
GPUS, SEQ, GBS = 2048, 4096, 15360


@contextmanager
def every_pass_paired():
    """cost_models.moe.unpaired_share as 0 inside: every block's forward beside another's backward."""
    from cost_models import moe
    saved = moe.unpaired_share
    moe.unpaired_share = lambda lay, m_micro: np.zeros(np.shape(np.asarray(lay.pp)))
    try:
        yield
    finally:
        moe.unpaired_share = saved


def dualpipe_bubble(p, f, b, w):
    """DualPipe's bubble in units of a stage's micro-batch (f + b + w): (p/2 - 1)(F&B + B - 3W) with F&B = f + b + w,
    B = b + w (b: the input gradient; w: the weight gradient), W = w (DeepSeek-V3 report, Table 2)."""
    return (np.asarray(p, dtype=float) / 2 - 1) * (f + 2 * b - w) / (f + b + w)


@contextmanager
def dualpipe_schedule():
    """cost_models.total.bubble_factor as DualPipe's for a 1F1B layout (v 1) inside, evaluate's own (f, b, w)."""
    from cost_models import total
    saved = total.bubble_factor

    def bubble(lay, m_micro, costs=None):
        f, b, w = (1.0, 1.0, 1.0) if costs is None else costs
        return np.where(np.asarray(lay.pp) > 1, dualpipe_bubble(lay.pp, f, np.maximum(b, f), w), 0.0)
    total.bubble_factor = bubble
    try:
        yield
    finally:
        total.bubble_factor = saved


def rates() -> dict:
    """{dispatcher: {"1f1b": (step s, exposed all-to-all s, tokens/s/GPU), "paired": (...), "dualpipe": (...)}} for
    NCCL's all-to-all and DeepEP's dispatcher (as parplan's time breakdown reports the all-to-all: rank 0's);
    "dualpipe" is "paired" with DualPipe's bubble and without the pipeline's sends."""
    from cost_models.total import evaluate
    from planner.core import plan_inputs, recommend
    from planner.models import load_preset
    from planner.search import Pins
    spec = load_preset("deepseek-v3").model_copy(update={"mtp_layers": 1})
    out = {}
    for dispatcher in ("alltoall", "deepep"):
        plan = recommend(spec, GPUS, hardware="h800-sxm-80gb", framework="megatron", seq_len=SEQ,
                         global_batch_size=GBS, pins=Pins(tp=1, pp=16, ep=64, cp=1, zero=1, recompute="none"),
                         suggest=False, top_k=1, fp8=True, mla_recompute=True, moe_dispatcher=dispatcher,
                         balance_head=True)
        _, m, tr, hw, arr = plan_inputs(plan)
        row, bubbles = {}, {}
        for name, consts in (("1f1b", tr), ("paired", replace(tr, moe_a2a_overlap=True))):
            with every_pass_paired():
                met = evaluate(m, consts, hw, arr)
            step = float(met["step_time_s"][0])
            row[name] = (step, float(met["ep_comm_s"][0]), GBS * SEQ / step / GPUS)
            bubbles[name] = float(met["bubble_s"][0])
        with every_pass_paired(), dualpipe_schedule():
            met = evaluate(m, replace(tr, moe_a2a_overlap=True), hw, arr)
        step = float(met["step_time_s"][0] - met["pp_comm_s"][0])
        row["dualpipe"] = (step, float(met["ep_comm_s"][0]), GBS * SEQ / step / GPUS)
        row["bubble"] = (float(met["bubble_s"][0]), bubbles["paired"])  # DualPipe's and the paired 1F1B's, s
        out[dispatcher] = row
    return out


def main() -> None:
    print(f"published: {PUBLISHED_TOKENS_PER_S_GPU:,.0f} tokens/s/GPU (2,664K H800 GPU hours for 14.8T tokens)")
    for dispatcher, row in rates().items():
        for name, (step, ep, rate) in ((k, v) for k, v in row.items() if k != "bubble"):
            print(f"{dispatcher:8s} {name:6s} step {step:6.2f} s, all-to-all exposed {ep:5.2f} s, {rate:7,.0f} "
                  f"tokens/s/GPU ({rate / PUBLISHED_TOKENS_PER_S_GPU - 1:+.1%})")


if __name__ == "__main__":
    main()
