"""Attention and MLP side by side in parplan's runtime (ModelConfig.parallel_block: GPT-J's, Falcon-7B's, Phi-2's,
Command R's blocks; parallel_layers.model.Block._parallel_forward): the block's formula on one rank, and on 4 gloo
ranks under tp / SP / pp / cp / ZeRO layouts against one-rank runs of the same plan (dp folded into gradient
accumulation).  The five input projections read one gathered input and the two output projections' partial sums are
reduced once: a reduction missed or doubled, a bias added on every tp rank before the sum, or a norm gradient not summed
over the sequence shards would change the gradients and then the losses."""
from __future__ import annotations

import pytest
import torch

from parallel_layers.model import ModelConfig, StageModule, init_parameters
from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, tiny_plan

REFERENCES = {"llama": {**TINY_LLAMA, "parallel_block": True},
              "gpt": {**TINY_GPT, "parallel_block": True},  # (GPT-J's kind: both output projections' biases)
              "cohere": {**TINY_LLAMA, "parallel_block": True, "qk_norm": True}}  # (Command R+'s q/k norms)
CASES = {
    "tp2-dp2": ("llama", dict(tp=2, pp=1, dp=2)),
    "tp2-pp2-sp-1f1b-selective": ("llama", dict(tp=2, pp=2, dp=1, sp=True, schedule="1f1b", recompute="selective")),
    "cp2-tp2-sp-full": ("llama", dict(tp=2, pp=1, dp=1, cp=2, sp=True, recompute="full")),
    "gpt-tp2-dp2-sp-fsdp2": ("gpt", dict(tp=2, pp=1, dp=2, sp=True, zero_stage=3)),
    # ZB-V: the input- and weight-gradient passes split (layers.WeightGradStore) over the five linears read together
    "gpt-tp2-pp2-sp-zbv": ("gpt", dict(tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)),
    "cohere-tp2-dp2-zero2": ("cohere", dict(tp=2, pp=1, dp=2, zero_stage=2)),
}


@pytest.mark.parametrize("model", [TINY_LLAMA, TINY_GPT], ids=["llama", "gpt"])
def test_the_block_is_attention_and_mlp_side_by_side(model):
    """block(x) = x + attention(norm1(x)) + mlp(norm1(x)) on one rank, no second norm; the parameters are the count's."""
    from cost_models.params import param_counts
    plan = tiny_plan({**model, "parallel_block": True})
    m = StageModule(ModelConfig.from_plan(plan), list(range(model["layers"])), first=True, last=True, tp_group=None)
    init_parameters(m, 0)
    blk = m.blocks[0]
    assert blk.norm2 is None
    x = torch.randn(2, 16, model["hidden"], generator=torch.Generator().manual_seed(2))
    h = blk.norm1(x)
    torch.testing.assert_close(blk(x), x + blk.attn(h) + blk.mlp(h))
    counts = param_counts(plan.model)
    sequential = param_counts(tiny_plan(model).model)
    norm = model["hidden"] * (1 if model["arch"] == "llama" else 2)
    assert sequential["total"] - counts["total"] == model["layers"] * norm
    held = sum(p.numel() for p in m.parameters())
    assert held - counts["total"] == (sum(p.numel() for p in StageModule(
        ModelConfig.from_plan(tiny_plan(model)), list(range(model["layers"])), first=True, last=True,
        tp_group=None).parameters()) - sequential["total"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite.run_against_one_rank(tmp_path_factory.mktemp("parallel_block"), REFERENCES, CASES)


@pytest.mark.multirank
@pytest.mark.parametrize("case", list(CASES))
def test_parallel_block_layouts_match_one_rank(runs, case):
    reference, layout = CASES[case]
    names = (".wo.", ".norm1.") + ((".fc2.bias",) if REFERENCES[reference]["arch"] == "gpt" else ())
    suite.check_against_one_rank(runs, case, reference, layout, names, 1e-4, 1e-5)
