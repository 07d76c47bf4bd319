"""Mixtures of experts with dense blocks between the MoE ones (ModelSpec.first_dense_layers, moe_layer_step,
dense_ffn_hidden): which blocks are MoE, which pipeline rank holds how many dense blocks, and the cost model's sums
over a rank's blocks of both kinds, each held to a count done here by hand or to the same model with every block of
one kind."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from cost_models.layout import (SCH_1F1B, SCH_INTERLEAVED, SCH_ZBV, Layout, ModelDims, rank_block_counts,
                                rank_dense_blocks, stage_layers, stages_of_rank)
from cost_models.params import param_counts
from planner.core import recommend, training_consts
from planner.export import megatron_moe_layer_freq
from planner.hf_config import model_from_hf_config as spec_from_hf_config
from planner.models import load_preset
from planner.search import Pins
from planner.schema import ModelSpec

GLM_AIR = dict(arch="llama", layers=46, hidden=4096, heads=96, kv_heads=8, head_dim=128, ffn_hidden=1408, vocab=151552,
               experts=128, experts_per_token=8, shared_expert_ffn=1408, first_dense_layers=1, dense_ffn_hidden=10944)


def test_which_blocks_are_moe():
    """Hugging Face's rules: GLM-4.5's first_k_dense_replace (block i MoE where i >= k), Llama 4's and Qwen-MoE's step
    ((i + 1) % step == 0); the count in closed form agrees with the rule block by block, ModelDims with ModelSpec."""
    glm = load_preset("glm-4.5")
    assert [glm.is_moe_block(i) for i in range(5)] == [False, False, False, True, True]
    assert glm.moe_block_count == 89
    mav = load_preset("llama4-maverick")
    assert [mav.is_moe_block(i) for i in range(4)] == [False, True, False, True] and mav.moe_block_count == 24
    for k, step, layers in ((0, 1, 7), (3, 1, 7), (0, 2, 7), (1, 2, 8), (2, 3, 11), (5, 4, 9)):
        spec = ModelSpec(**{**GLM_AIR, "layers": layers, "first_dense_layers": k or None, "moe_layer_step": step,
                            "dense_ffn_hidden": 64 if k or step > 1 else None})
        m = ModelDims.from_spec(spec, 128)
        rule = [i >= k and (i + 1) % step == 0 for i in range(layers)]
        assert [spec.is_moe_block(i) for i in range(layers)] == rule == [m.is_moe_block(i) for i in range(layers)]
        assert spec.moe_block_count == sum(rule) == m.moe_blocks


@pytest.mark.parametrize("name,total,active,ends", [("glm-4.5", 352.8, 32, False), ("glm-4.5-air", 106.9, 12, False),
                                                    ("llama4-maverick", 400.7, 17, True)])
def test_presets_count_their_dense_blocks(name, total, active, ends):
    """The dense blocks at their own width: the cards' active counts, GLM's (32B, 12B) a token's parameters less the
    embedding and head, Llama 4's (17B, as Scout's) with them; the totals are parplan's (GLM-4.5's card, 355B, counts a
    multi-token-prediction layer, one more MoE block; Maverick's 400B its vision encoder; the Air's 106B is rounded)."""
    spec = load_preset(name)
    c = param_counts(spec)
    assert round(c["total"] / 1e9, 1) == total and c["total"] == spec.num_params
    assert round((c["active"] - (0 if ends else c["embedding"] + c["head"])) / 1e9) == active
    assert spec.moe_block_count < spec.layers


def test_a_model_must_keep_an_moe_block_and_name_the_dense_width():
    for extra, match in (({"first_dense_layers": 46, "dense_ffn_hidden": 64}, "leave none of the 46 blocks"),
                         ({"first_dense_layers": 2, "dense_ffn_hidden": None}, "give dense_ffn_hidden"),
                         ({"first_dense_layers": None, "dense_ffn_hidden": 64}, "leave dense_ffn_hidden out"),
                         ({"experts": None, "experts_per_token": None, "shared_expert_ffn": None}, "need experts")):
        with pytest.raises(ValueError, match=match):
            ModelSpec(**{**GLM_AIR, **extra})


def _brute_dense(m, pp, vpp, zbv):
    """Per pipeline rank: (blocks, dense blocks), from stage_layers and stages_of_rank block by block."""
    v = 2 if zbv and pp > 1 else vpp
    sizes = stage_layers(m.layers, pp * v)
    starts = np.cumsum([0] + sizes)
    out = []
    for r in range(pp):
        layers = [i for s in stages_of_rank(r, pp, v, "zbv" if zbv else "1f1b")
                  for i in range(starts[s], starts[s] + sizes[s])]
        out.append((len(layers), sum(not m.is_moe_block(i) for i in layers)))
    return out


@pytest.mark.parametrize("k,step", [(1, 1), (3, 1), (0, 2), (1, 2), (7, 1)])
def test_dense_blocks_per_pipeline_rank(k, step):
    """rank_dense_blocks against the blocks each rank holds, counted one by one: rank 0 and rank pp-1 exactly, and the
    middle rank the model prices is the one of rank_block_counts' middle count with the fewest dense blocks."""
    m = ModelDims.from_spec(ModelSpec(**{**GLM_AIR, "layers": 30, "first_dense_layers": k or None,
                                         "moe_layer_step": step, "dense_ffn_hidden": 64}), 128)
    rows = [(pp, v, z) for pp in (1, 2, 3, 4, 5, 8) for v in (1, 2, 3) for z in (False, True)
            if (not z or v == 2) and pp * v <= 30]
    pp, vpp, zbv = (np.array([r[i] for r in rows]) for i in range(3))
    sch = np.where(zbv, SCH_ZBV, np.where(vpp > 1, SCH_INTERLEAVED, SCH_1F1B))
    blocks = rank_block_counts(m.layers, pp, vpp, sch)
    dense = rank_dense_blocks(m, pp, vpp, sch)
    for j, (p, v, z) in enumerate(rows):
        brute = _brute_dense(m, p, v, z)
        assert (blocks[0][j], dense[0][j]) == brute[0] and (blocks[2][j], dense[2][j]) == brute[-1], rows[j]
        middle = brute[1:-1] or [brute[0]]
        assert blocks[1][j] == max(b for b, _ in middle)
        assert dense[1][j] == min(d for b, d in middle if b == blocks[1][j]), rows[j]
    assert rank_dense_blocks(replace(m, first_dense=0, moe_step=1), pp, vpp, sch) == (0, 0, 0)


def _evaluate(m, **lay):
    from cost_models.total import evaluate
    import hardware_profiles
    from cost_models.hardware import constants_from_profile
    spec = ModelSpec(**GLM_AIR)
    plan = recommend(spec, 8, framework="megatron", global_batch_size=64, seq_len=m.seq_len, top_k=1, suggest=False)
    tr = training_consts(plan.training)
    hw = constants_from_profile(hardware_profiles.load_profile("h100-sxm-80gb"), "bf16")
    base = dict(tp=1, pp=1, dp=1, cp=1, mbs=1, zero=1, recompute=0, sp=0, schedule=SCH_1F1B, vpp=1, offload=0, gpus=8,
                ep=1)
    base.update(lay)
    return evaluate(m, tr, hw, Layout(**base))


def test_one_stage_sums_each_blocks_own_terms():
    """Without a pipeline a rank holds every block, so its weights, compute and traffic are the all-MoE model's less
    k blocks' difference from the all-dense model's (same attention, embedding and head): linear in the dense blocks'
    count, which only the mixed sums give."""
    mixed = ModelDims.from_spec(ModelSpec(**{**GLM_AIR, "layers": 8, "first_dense_layers": 3}), 1024)
    moe = replace(mixed, first_dense=0, dense_ffn=0)
    dense = replace(mixed.dense_dims(), layers=8)
    got, a, b = (_evaluate(x, tp=2, sp=1, dp=4, ep=8, gpus=8) for x in (mixed, moe, dense))
    for key in ("mem_weights", "mem_activations", "compute_s", "comm_tp_bytes", "comm_ep_bytes", "ep_comm_s", "tp_comm_s"):
        want = a[key] + 3 / 8 * (b[key] - a[key])
        assert float(got[key]) == pytest.approx(float(want), rel=1e-9), key
    assert float(got["comm_ep_bytes"]) == pytest.approx(5 / 8 * float(a["comm_ep_bytes"]), rel=1e-12)
    # the model FLOPs a token: 6 x its matmul parameters (the active ones) + the attention's
    spec = ModelSpec(**{**GLM_AIR, "layers": 8, "first_dense_layers": 3})
    mm = param_counts(spec)["matmul"]
    assert float(got["model_flops_per_token"]) == pytest.approx(6 * mm + 12 * 8 * 96 * 128 * 1024, rel=1e-12)


def test_the_leading_dense_blocks_lighten_pipeline_rank_0_only():
    """pp 4 over GLM-4.5-Air's 46 blocks (11, 12, 12, 11): its one dense block sits on rank 0, whose parameters are
    one block's difference below the all-MoE twin's; the middle and last ranks hold the same as the twin's."""
    from cost_models.memory import layer_params_per_gpu, rank_params
    m = ModelDims.from_spec(ModelSpec(**GLM_AIR), 4096)
    moe = replace(m, first_dense=0, dense_ffn=0)
    lay = Layout(tp=1, pp=4, dp=2, cp=1, mbs=1, zero=1, recompute=0, sp=0, schedule=SCH_1F1B, vpp=1, offload=0,
                 gpus=8, ep=2)
    got, twin = rank_params(m, lay), rank_params(moe, lay)
    one = layer_params_per_gpu(moe, 1, 2) - layer_params_per_gpu(m.dense_dims(), 1)
    assert float(got[0]) == pytest.approx(float(twin[0]) - one, rel=1e-12)
    assert float(got[1]) == float(twin[1]) and float(got[2]) == float(twin[2])


def test_glm4_moe_configs_read_their_dense_blocks(tmp_path):
    """GLM-4.5-Air's config.json: first_k_dense_replace 1 of intermediate_size, n_shared_experts x
    moe_intermediate_size, as the preset has it; Qwen-MoE's leading mlp_only_layers and decoder_sparse_step are read,
    other dense layers refused in one line."""
    cfg = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "first_k_dense_replace": 1, "head_dim": 128,
           "hidden_size": 4096, "intermediate_size": 10944, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
           "n_routed_experts": 128, "n_shared_experts": 1, "num_attention_heads": 96, "num_experts_per_tok": 8,
           "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
           "partial_rotary_factor": 0.5, "tie_word_embeddings": False, "vocab_size": 151552}
    spec = spec_from_hf_config(cfg)
    preset = load_preset("glm-4.5-air")
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "experts", "experts_per_token",
                  "shared_expert_ffn", "first_dense_layers", "moe_layer_step", "dense_ffn_hidden", "vocab"):
        assert getattr(spec, field) == getattr(preset, field), field
    assert spec.num_params == preset.num_params
    qwen = {"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 4, "intermediate_size": 1536, "moe_intermediate_size": 256, "num_experts": 16,
            "num_experts_per_tok": 2, "vocab_size": 1000}
    got = spec_from_hf_config({**qwen, "mlp_only_layers": [1, 0], "decoder_sparse_step": 2})
    assert (got.first_dense_layers, got.moe_layer_step, got.dense_ffn_hidden) == (2, 2, 1536)
    assert [got.is_moe_block(i) for i in range(8)] == [False, False, False, True, False, True, False, True]
    assert spec_from_hf_config(qwen).first_dense_layers is None
    with pytest.raises(ValueError, match=r"mlp_only_layers \[0, 2\]: dense layers other than a leading run"):
        spec_from_hf_config({**qwen, "mlp_only_layers": [0, 2]})


def test_megatron_gets_the_layer_pattern_and_both_widths():
    glm, mav = load_preset("glm-4.5"), load_preset("llama4-maverick")
    assert megatron_moe_layer_freq(glm) == "([0]*3+[1]*89)"
    assert megatron_moe_layer_freq(mav) == "([0]*1+[1])*24"
    odd = ModelSpec(**{**GLM_AIR, "layers": 7, "first_dense_layers": 1, "moe_layer_step": 2})
    assert eval(megatron_moe_layer_freq(odd)) == [int(odd.is_moe_block(i)) for i in range(7)]  # noqa: S307
    for spec in (glm, mav, odd):
        assert eval(megatron_moe_layer_freq(spec)) == [int(spec.is_moe_block(i)) for i in range(spec.layers)]  # noqa
    out = subprocess.run([sys.executable, "-m", "planner.cli", "recommend", "--model", "glm-4.5-air", "--gpus", "64",
                          "--framework", "megatron", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    exp = subprocess.run([sys.executable, "-m", "planner.cli", "export", "-", "--to", "megatron"], input=out.stdout,
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    assert "--ffn-hidden-size 10944" in exp.stdout and "--moe-ffn-hidden-size 1408" in exp.stdout
    assert "--moe-layer-freq '([0]*1+[1]*45)'" in exp.stdout


def test_explicit_flags_plan_a_mixed_model_and_refuse_half_of_one():
    base = [sys.executable, "-m", "planner.cli", "recommend", "--layers", "8", "--hidden", "512", "--heads", "8",
            "--ffn-hidden", "256", "--gpus", "8", "--json"]
    out = subprocess.run(base + ["--experts", "8", "--experts-per-token", "2", "--first-dense-layers", "2",
                                 "--dense-ffn", "1536"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["model"]
    assert (m["first_dense_layers"], m["dense_ffn_hidden"]) == (2, 1536)
    bad = subprocess.run(base + ["--experts", "8", "--experts-per-token", "2", "--first-dense-layers", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "dense_ffn_hidden" in bad.stderr


def test_the_summary_says_where_the_dense_blocks_sit():
    from planner.render import summary_lines
    plan = recommend("glm-4.5", 64, framework="megatron", global_batch_size=256, seq_len=4096,
                     pins=Pins(pp=4, vpp=1, tp=2, ep=8), top_k=1, suggest=False)
    line = next(s for s in summary_lines(plan) if s.startswith("stage_layers"))
    assert line.endswith("; dense blocks 3 in stage 0"), line
    model = next(s for s in summary_lines(plan) if s.startswith("model "))
    assert "the first 3 of the 92 blocks dense, ffn 12288" in model
    how = next(s for s in summary_lines(plan) if s.startswith("how accurate"))
    # the published MoE runs of a model with dense blocks between: DeepSeek-V3's (planner/data/accuracy.json)
    assert __import__("re").search(r"\(2 of them DeepSeek-V3's, with latent attention, dense blocks between its MoE "
                                   r"ones and multi-token prediction: \|error\| median \d+\.\d %, max \d+\.\d %\)$",
                                   how), how


def test_llama4_configs_read_their_interleaved_dense_blocks():
    """A Llama 4 config (its text_config, Llama4TextConfig's defaults filling what it leaves out): Maverick's
    interleave_moe_layer_step 2 with intermediate_size_mlp as the dense width reads as the preset, the default text
    config as Scout's (every block MoE); moe_layers other than the step's are refused in one line."""
    mav = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
           "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408},
           "text_config": {"model_type": "llama4_text", "interleave_moe_layer_step": 2, "num_local_experts": 128,
                           "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048}}
    spec, preset = spec_from_hf_config(mav), load_preset("llama4-maverick")
    for field in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "experts", "experts_per_token",
                  "shared_expert_ffn", "first_dense_layers", "moe_layer_step", "dense_ffn_hidden", "vocab", "num_params",
                  "attention_chunk", "full_attention_every"):  # (its chunks: Llama4TextConfig's defaults, 8192 and 4)
        assert getattr(spec, field) == getattr(preset, field), field
    assert spec.attention_chunk == 8192 and spec.chunked_layers == 36
    scout = spec_from_hf_config({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}})
    assert scout.num_params == load_preset("llama4-scout").num_params and scout.moe_block_count == 48
    assert spec_from_hf_config({**mav, "text_config": {**mav["text_config"],
                                                       "moe_layers": list(range(1, 48, 2))}}).moe_layer_step == 2
    with pytest.raises(ValueError, match=r"moe_layers \[0, 1\]: MoE layers other than every"):
        spec_from_hf_config({**mav, "text_config": {**mav["text_config"], "moe_layers": [0, 1]}})


def test_dots1_configs_read_as_deepseek_style_without_latent_attention():
    """dots.llm1's config (dots1: DeepSeek-V3's MoE layout with multi-head attention): one leading dense block of
    intermediate_size, two shared experts of moe_intermediate_size, top 6 of 128; the card's 142B total and 14B
    active, counted here as 142.8B and 14.0B."""
    cfg = {"model_type": "dots1", "hidden_size": 4096, "num_hidden_layers": 62, "intermediate_size": 10944,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 152064, "first_k_dense_replace": 1,
           "moe_intermediate_size": 1408, "n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6,
           "max_position_embeddings": 32768, "tie_word_embeddings": False}
    spec = spec_from_hf_config(cfg)
    assert (spec.first_dense_layers, spec.shared_expert_ffn, spec.dense_ffn_hidden) == (1, 2816, 10944)
    c = param_counts(spec)
    assert round(c["total"] / 1e9, 1) == 142.8 and round(c["active"] / 1e9) == 14
    bare = spec_from_hf_config({k: v for k, v in cfg.items() if k not in ("first_k_dense_replace", "n_shared_experts")})
    assert bare.first_dense_layers is None and bare.shared_expert_ffn is None  # Dots1Config's defaults: none of either
