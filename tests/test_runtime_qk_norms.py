"""q/k norms in parplan's runtime (ModelConfig.qk_norm: Qwen3's, Gemma 3's, OLMo 2's norms on each query and key head
before rotary), on gloo: 4-rank layouts against one-rank runs of the same plan (dp folded into gradient accumulation),
as test_runtime_post_norms does for post-norms.  Each tensor-parallel rank norms its own heads over the whole
sequence, SP or not, so the norms' replicated weights get partial gradients there that must be summed over tp: a sum
missed (tp 2 without SP, the case no other norm has) or doubled would change the gradients and then the losses."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, TINY_MOE

pytestmark = pytest.mark.multirank

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
REFERENCES = {"llama": {**TINY_LLAMA, "qk_norm": True}, "gpt": {**TINY_GPT, "qk_norm": True},
              "moe": {**TINY_MOE, "qk_norm": True},  # (Qwen3-MoE's blocks)
              "gemma3": {**TINY_LLAMA, "qk_norm": True, "post_norms": True}}  # (Gemma 3's: both, six norms a block)
# name -> (reference, parallel layout); 4 ranks each
CASES = {
    "tp2-dp2": ("llama", dict(tp=2, pp=1, dp=2)),
    # ZeRO-2: each dp rank keeps its piece of every reduced gradient, the norms' summed over tp there too
    "tp2-dp2-zero2": ("llama", dict(tp=2, pp=1, dp=2, zero_stage=2)),
    "tp2-pp2-sp-1f1b-selective": ("llama", dict(tp=2, pp=2, dp=1, sp=True, schedule="1f1b", recompute="selective")),
    # (selective recompute: the norms and rotary at the global positions re-run inside the attention's checkpoint)
    "cp2-tp2-selective": ("llama", dict(tp=2, pp=1, dp=1, cp=2, recompute="selective")),
    "gpt-tp2-dp2-fsdp2": ("gpt", dict(tp=2, pp=1, dp=2, zero_stage=3)),
    # ZB-V: the backward split into input- and weight-gradient passes (layers.WeightGradStore)
    "gpt-tp2-pp2-sp-zbv": ("gpt", dict(tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)),
    "moe-tp2-dp2-sp-ep2": ("moe", dict(tp=2, pp=1, dp=2, sp=True, ep=2)),
    "gemma3-tp2-dp2-sp": ("gemma3", dict(tp=2, pp=1, dp=2, sp=True)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite.run_against_one_rank(tmp_path_factory.mktemp("qk_norms"), REFERENCES, CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_losses_and_gradients_match_one_rank(runs, case):
    """The losses, and step 1's reduced gradients, the q/k norms' among them (replicated: equal on every tp rank)."""
    reference, layout = CASES[case]
    suite.check_against_one_rank(runs, case, reference, layout, (".q_norm.", ".k_norm."), LOSS_RTOL, GRAD_RTOL)


@pytest.mark.parametrize("name", list(REFERENCES))
def test_the_runtime_holds_the_counted_parameters_and_the_norms(runs, name):
    """The one-rank run's parameters are cost_models.params.param_counts' total plus the q/k norms' weights, which the
    count leaves out as it does for every family that has them (ModelSpec.qk_norm): two norms of head_dim a layer
    (LayerNorm: a bias each too)."""
    from cost_models.params import param_counts
    from planner.schema import ModelSpec
    spec = ModelSpec(**REFERENCES[name])
    per_norm = spec.hidden // spec.heads * (1 if spec.arch == "llama" else 2)
    # (gpt's learned position table: seq_len rows, tiny_plan's 32)
    assert suite.report(runs, f"ref-{name}")["params_per_rank"] == [param_counts(spec, seq_len=32)["total"]
                                                                    + spec.layers * 2 * per_norm]
