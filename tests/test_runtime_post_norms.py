"""Post-norms in parplan's runtime (ModelConfig.post_norms: Gemma 2 / 3's and GLM-4's norm on each sublayer's output),
on gloo: 4-rank layouts against one-rank runs of the same plan (dp folded into gradient accumulation), as
test_runtime_mla does for latent attention.  Under sequence parallelism each rank norms its sequence shard and the
replicated weights' partial gradients are summed over tp; without it every tp rank norms the whole reduced output:
a sum missed or doubled, or a norm on a partial (unreduced) output, would change the losses or the gradients."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA

pytestmark = pytest.mark.multirank

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
REFERENCES = {"llama": {**TINY_LLAMA, "post_norms": True}, "gpt": {**TINY_GPT, "post_norms": True}}
# name -> (reference, parallel layout); 4 ranks each
CASES = {
    "tp2-dp2-sp": ("llama", dict(tp=2, pp=1, dp=2, sp=True)),
    "tp2-pp2-1f1b-selective": ("llama", dict(tp=2, pp=2, dp=1, schedule="1f1b", recompute="selective")),
    "gpt-tp2-pp2-sp-zbv": ("gpt", dict(tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite.run_against_one_rank(tmp_path_factory.mktemp("post_norms"), REFERENCES, CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_losses_and_gradients_match_one_rank(runs, case):
    """The losses, and step 1's reduced gradients, the post-norms' among them (replicated: equal on every tp rank)."""
    reference, layout = CASES[case]
    suite.check_against_one_rank(runs, case, reference, layout, (".post_norm1.", ".post_norm2."), LOSS_RTOL, GRAD_RTOL)


@pytest.mark.parametrize("name", list(REFERENCES))
def test_the_runtime_holds_the_parameters_the_planner_counts(runs, name):
    """The one-rank run's parameters are cost_models.params.param_counts' total, the four norms a block included."""
    from cost_models.params import param_counts
    from planner.schema import ModelSpec
    spec = ModelSpec(**REFERENCES[name])
    # (gpt's learned position table: seq_len rows, tiny_plan's 32)
    assert suite.report(runs, f"ref-{name}")["params_per_rank"] == [param_counts(spec, seq_len=32)["total"]]
    plain = ModelSpec(**{**REFERENCES[name], "post_norms": None})
    per_norm = spec.hidden * (1 if spec.arch == "llama" else 2)  # (LayerNorm: a bias too)
    assert param_counts(spec)["total"] - param_counts(plain)["total"] == spec.layers * 2 * per_norm
