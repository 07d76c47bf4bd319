"""q/k norms in parplan's runtime (ModelConfig.qk_norm: Qwen3's and Gemma 3's norms on each query and key head
before rotary), on gloo: 4-rank layouts against one-rank runs of the same plan (dp folded into gradient accumulation),
as test_runtime_post_norms does for post-norms.  Each tensor-parallel rank norms its own heads over the whole
sequence, SP or not, so the norms' replicated weights get partial gradients there that must be summed over tp: a sum
missed (tp 2 without SP, the case no other norm has) or doubled would change the gradients and then the losses.
Norms over the whole query and key width (ModelConfig.qk_norm_whole: OLMo 2's) split their weights over tp instead and
all-reduce their statistics there, forward and backward: a rank that normed its own columns alone would change both.
The other block options of the model families read from configs ride along: the norms after the sublayers (OLMo 2,
EXAONE 4) and Qwen2's q/k/v biases, split over tp with their projections."""
from __future__ import annotations

import pytest

from tests.runtime_helpers import suite
from tests.runtime_helpers.plans import TINY_GPT, TINY_LLAMA, TINY_MOE

pytestmark = pytest.mark.multirank

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-5
REFERENCES = {"llama": {**TINY_LLAMA, "qk_norm": True}, "gpt": {**TINY_GPT, "qk_norm": True},
              "moe": {**TINY_MOE, "qk_norm": True},  # (Qwen3-MoE's blocks)
              "gemma3": {**TINY_LLAMA, "qk_norm": True, "post_norms": True},  # (Gemma 3's: both, six norms a block)
              # each norm over the whole query / key width (ModelConfig.qk_norm_whole: OLMo 2's, OLMoE's), its weight
              # split over tp and its statistics all-reduced there; OLMo 2's block puts its two norms on the
              # sublayers' outputs too (norms_after)
              "olmo2": {**TINY_LLAMA, "qk_norm": True, "qk_norm_whole": True, "norms_after": True},
              "gpt-whole": {**TINY_GPT, "qk_norm": True, "qk_norm_whole": True},
              "olmoe": {**TINY_MOE, "qk_norm": True, "qk_norm_whole": True},
              # EXAONE 4's block: per-head q/k norms, the two norms after the sublayers
              "exaone4": {**TINY_LLAMA, "qk_norm": True, "norms_after": True},
              # Qwen2's q/k/v biases (ModelConfig.qkv_bias), split over tp with their projections
              "qwen2": {**TINY_LLAMA, "qkv_bias": True}}
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
    # whole-width norms: the statistics' all-reduce over tp forward and backward (and again in selective recompute's
    # re-run), the weights' tp slices
    "olmo2-tp2-dp2": ("olmo2", dict(tp=2, pp=1, dp=2)),
    "olmo2-tp2-pp2-sp-1f1b-selective": ("olmo2", dict(tp=2, pp=2, dp=1, sp=True, schedule="1f1b",
                                                      recompute="selective")),
    "olmo2-cp2-tp2-selective": ("olmo2", dict(tp=2, pp=1, dp=1, cp=2, recompute="selective")),
    "gpt-whole-tp2-dp2-fsdp2": ("gpt-whole", dict(tp=2, pp=1, dp=2, zero_stage=3)),
    "gpt-whole-tp2-pp2-sp-zbv": ("gpt-whole", dict(tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)),
    "olmoe-tp2-dp2-sp-ep2": ("olmoe", dict(tp=2, pp=1, dp=2, sp=True, ep=2)),
    "exaone4-tp2-dp2-sp": ("exaone4", dict(tp=2, pp=1, dp=2, sp=True)),
    "qwen2-tp2-dp2": ("qwen2", dict(tp=2, pp=1, dp=2)),
    "qwen2-tp2-pp2-sp-zbv": ("qwen2", dict(tp=2, pp=2, dp=1, sp=True, schedule="zbv", vpp=2)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return suite.run_against_one_rank(tmp_path_factory.mktemp("qk_norms"), REFERENCES, CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_losses_and_gradients_match_one_rank(runs, case):
    """The losses, and step 1's reduced gradients, the q/k norms' (or the q/k/v biases') among them."""
    reference, layout = CASES[case]
    model = REFERENCES[reference]
    names = ((".q_norm.", ".k_norm.") if model.get("qk_norm") else ()) + ((".wq.bias",) if model.get("qkv_bias") else ())
    suite.check_against_one_rank(runs, case, reference, layout, names, LOSS_RTOL, GRAD_RTOL)


@pytest.mark.parametrize("name", list(REFERENCES))
def test_the_runtime_holds_the_counted_parameters_and_the_norms(runs, name):
    """The one-rank run's parameters are cost_models.params.param_counts' total plus the q/k norms' weights, which the
    count leaves out as it does for every family that has them (ModelSpec.qk_norm): two norms of head_dim a layer, or
    of the q and k widths (qk_norm_whole) (LayerNorm: a bias each too); Qwen2's q/k/v biases are in the count."""
    from cost_models.params import param_counts
    from planner.schema import ModelSpec
    spec = ModelSpec(**REFERENCES[name])
    d = spec.hidden // spec.heads
    # per head: one head_dim weight each; whole width: the q and the k width (qk_norm_whole); LayerNorm a bias too
    widths = 0 if not spec.qk_norm else (spec.heads + spec.kv_heads) * d if spec.qk_norm_whole else 2 * d
    # (gpt's learned position table: seq_len rows, tiny_plan's 32)
    assert suite.report(runs, f"ref-{name}")["params_per_rank"] == [param_counts(spec, seq_len=32)["total"]
                                                                    + spec.layers * widths
                                                                    * (1 if spec.arch == "llama" else 2)]
