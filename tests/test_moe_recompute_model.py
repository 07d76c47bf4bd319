"""The memory model of a mixture of experts' recompute modules (training.moe_recompute act / norm-act) as parplan's
runtime runs them (parallel_layers.model.Block): each MoE block a rank holds for a micro-batch in flight saves the
bytes the runtime stops keeping fewer, k x expert_ffn a routed token (the activation's output) and h a token of the
rank's sequence shard (the pre-MLP norm's output), the same count as the allocator's in tests/test_runtime_moe_recompute
.py; nothing where blocks are recomputed whole, nothing for a dense block between.  Megatron's rule is kept as it was
(tests/test_moe.py::test_moe_recompute_modules_trade_saved_outputs_for_a_pass)."""
from __future__ import annotations

import pytest

from planner.core import evaluate_plan, recommend
from planner.search import Pins
from tests.runtime_helpers.plans import tiny_plan

MODES = ("act", "norm-act")


def _per_block(t: float, k: int, f: int, h: int, mode: str, act_bytes: int = 2) -> float:
    """What the runtime stops keeping a block and micro-batch, t tokens of the rank (its sequence shard)."""
    return t * (k * f + (h if mode == "norm-act" else 0)) * act_bytes


def test_parplan_plans_what_its_runtime_frees_and_megatron_is_unchanged():
    """Mixtral 8x7B, tp 2 with SP, ep 8, one stage of 32 blocks and one micro-batch in flight (2048 tokens a rank):
    under both frameworks the saved activations drop by 32 blocks' count.  The block being back-propagated rebuilds
    what it dropped (the total drops by 31 blocks'), except, under parplan, the norm's output of a block without a
    shared expert, which its runtime rebuilds for the router's backward, after the experts' (moe.
    parplan_rebuilt_after_experts): 31 blocks' and one norm output."""
    def memory(framework, mode):
        pins = Pins(tp=2, pp=1, dp=32, cp=1, mbs=1, zero=1, recompute="none", sp=True, schedule="1f1b",
                    offload="none", ep=8)
        return recommend("mixtral-8x7b", 64, framework=framework, global_batch_size=256, seq_len=4096, pins=pins,
                         top_k=1, suggest=False, moe_recompute=mode).prediction.memory_bytes_per_gpu
    t, h, f, k = 2048, 4096, 14336, 2
    for framework in ("megatron", "parplan"):
        base = memory(framework, "none")
        for mode in MODES:
            got, d = memory(framework, mode), _per_block(t, k, f, h, mode)
            assert base.activations - got.activations == pytest.approx(32 * d, rel=1e-12), (framework, mode)
            late = t * h * 2 if framework == "parplan" and mode == "norm-act" else 0.0
            assert base.total - got.total == pytest.approx(31 * d + late, rel=1e-12), (framework, mode)


NARROW_MOE = {"arch": "llama", "layers": 8, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 704, "vocab": 512,
              "experts": 4, "experts_per_token": 2}


def _activations(model, mode, **layout):
    plan = tiny_plan(model, precision="master-weights", seq_len=512, micro_batch_size=2, global_batch_size=16,
                     **layout)
    plan = plan.model_copy(update={"training": plan.training.model_copy(update={"moe_recompute": mode})})
    mem = evaluate_plan(plan).prediction.memory_bytes_per_gpu
    assert mem.peak_moment == "backward"
    return mem.activations


@pytest.mark.parametrize("name,model,layout,blocks", [pytest.param(*case, id=case[0]) for case in [
    # every rank 8 MoE blocks, one micro-batch in flight; with tp 2 and SP the rank's 512 tokens
    ("dp4-ep4", NARROW_MOE, dict(tp=1, pp=1, dp=4, ep=4), 8),
    ("tp2-sp-dp2-ep4", {**NARROW_MOE, "shared_expert_ffn": 704}, dict(tp=2, pp=1, dp=2, ep=4, sp=True), 8),
    # 1F1B: the first rank's 4 blocks, 2 micro-batches in flight
    ("pp2-1f1b", NARROW_MOE, dict(tp=1, pp=2, dp=2, ep=2, schedule="1f1b"), 8),
    # the first two blocks dense: 6 MoE blocks
    ("mixed-dp4-ep4", {**NARROW_MOE, "first_dense_layers": 2, "dense_ffn_hidden": 1408}, dict(tp=1, pp=1, dp=4, ep=4),
     6),
    # whole blocks recomputed: nothing more
    ("full", NARROW_MOE, dict(tp=1, pp=1, dp=4, ep=4, recompute="full"), 0),
]])
def test_each_moe_block_in_flight_saves_the_runtimes_count_less(name, model, layout, blocks):
    t = 1024 / (layout["tp"] if layout.get("sp") else 1)
    base = _activations(model, "none", **layout)
    for mode in MODES:
        drop = base - _activations(model, mode, **layout)
        assert drop == pytest.approx(blocks * _per_block(t, 2, 704, 256, mode), rel=1e-12), (name, mode, drop)
